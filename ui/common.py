"""What every tab shares: the app context, error handling that never shows a traceback, callbacks with
named API parameters, event outputs by name, the runs a browser remembers and who may act on them. How runs are labelled and
which curves they draw live in lab/views/run_labels.py and lab/views/curves.py."""
from __future__ import annotations

import functools
import inspect
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Literal, Optional

import gradio as gr

from lab.config import ConfigError, in_words
from lab.engine.jobs import JobManager
from lab.engine.limits import valid_owner
from lab.engine.store import RunIdError, RunStore

log = logging.getLogger("lab.app")
PRIVATE: Literal["private"] = "private"  # api_visibility of a listener that only wires the page: not in the app's API


@dataclass(frozen=True)
class AppContext:
    store: RunStore
    jobs: JobManager


def errors_as_messages(fn: Callable) -> Callable:
    """Turn any exception in a callback into a one-line message (gr.Error), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ConfigError as exc:  # the field by its label, as the knob beside it reads
            what, message = in_words(exc)
            raise gr.Error(_one_line(ValueError(f"{what}: {message}")), print_exception=False) from None
        except (ValueError, KeyError, FileNotFoundError) as exc:
            raise gr.Error(_one_line(exc), print_exception=False) from None
        except Exception as exc:  # unexpected: log it for the operator, say it plainly to the user
            log.exception("callback %s failed", fn.__name__)
            raise gr.Error(f"Something went wrong ({type(exc).__name__}): {_one_line(exc)}",
                           print_exception=False) from None

    return wrapper


def with_api_params(fn: Callable, names: list[str]) -> Callable:
    """Give a *args callback real parameter names, so the API (gradio_client) shows them."""
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    if inspect.isgeneratorfunction(fn):  # gradio streams a generator's outputs: the wrapper must be one too
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            yield from fn(*args)
    else:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args)

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return wrapper


def kept() -> Any:
    """An `Outputs` field's default: an output left unnamed keeps what the page shows (gr.skip())."""
    return field(default_factory=gr.skip)


@dataclass(frozen=True)
class Outputs:
    """An event's outputs by name. A subclass declares one field per output, in the event's output order,
    each named as the component it writes (a tab's view attribute) and defaulting to `kept()`; a handler
    builds it by name and returns `values()`, the event is wired with `wired(view)`: both follow the one
    field order, so no handler's tuple has to match a list written elsewhere."""

    def values(self) -> tuple:
        """What the handler returns: each field's value in the declared order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def wired(cls, view: Any = None, **components: Any) -> list:
        """The event's outputs: each field's component, by name from `components` or else from `view`."""
        return [components[f.name] if f.name in components else getattr(view, f.name) for f in fields(cls)]


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split())[:500] or type(exc).__name__


MY_RUNS_KEPT = 50  # run ids a browser remembers (as the Train tab keeps them)


def remember_runs(runs: Any, new_ids: list[str]) -> list[str]:
    """The browser's "my runs" list with `new_ids` first (a BrowserState may hold anything: keep strings)."""
    old = [r for r in (runs if isinstance(runs, list) else [])[:200] if isinstance(r, str) and r not in new_ids]
    return (list(new_ids) + old)[:max(MY_RUNS_KEPT, len(new_ids))]


def is_run_id(ctx: AppContext, value: Any) -> bool:
    """Whether `value` is a well-formed run id (it may not exist)."""
    try:
        ctx.store.path(value)
    except RunIdError:
        return False
    return True


def acting_owner(ctx: AppContext, who: Any) -> Optional[str]:
    """The owner whose runs a stop or delete may touch: the caller's token on a public server
    (ownership enforced), None (anybody's) on a local one."""
    if not ctx.jobs.limits.public:
        return None
    if not valid_owner(who):
        raise ConfigError("owner", "this shared server needs your user token to stop or delete a run; reload the page")
    return who


@contextmanager
def permission() -> Iterator[None]:
    """Someone else's run: a one-line message, not an unexpected-error report."""
    try:
        yield
    except PermissionError as exc:
        raise gr.Error(" ".join(str(exc).split()), print_exception=False) from None
