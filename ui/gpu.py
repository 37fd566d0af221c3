"""Train on GPU, for a ZeroGPU Space: the run trains in chunks, each a `@spaces.GPU` call from the clicking
user's own request (which their daily GPU quota pays), resuming the last chunk's checkpoint
(lab/engine/chunks.py). When no GPU can be had (the quota is spent, or the GPU queue timed out) or the
page is closed, the run goes on in the CPU queue from its last checkpoint, and the page says so.

On ZeroGPU the GPU exists only inside such a call, in a process the `spaces` package forks for it, never
for a background job (spaces 0.51: zero/wrappers.py); its errors are gr.Errors told apart by their title
(zero/client.py). Off ZeroGPU the decorator returns the function unchanged (zero/decorator.py), so the same
chunks run in this process on whatever the run's device knob finds; the tests run them so. `spaces` is
imported only here, and only when it is installed.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import gradio as gr

from lab.config import ConfigError, RunConfig
from lab.engine.chunks import Chunk, request_stop, run_chunk, train_in_chunks
from lab.engine.environment import detect
from lab.engine.sharing import describe_claim
from lab.engine.store import LIVE_STATES
from ui.common import AppContext, Outputs, kept, with_api_params

log = logging.getLogger("lab.app")
CHUNK_S = float(os.environ.get("LAB_GPU_CHUNK_S", "40"))  # training time per GPU call
# what a call asks ZeroGPU for: the chunk, plus the forked process's start, CUDA, the model and the
# checkpoint's load and save (a shorter request gets a better place in ZeroGPU's queue)
GPU_DURATION_S = int(CHUNK_S + 20)
# the errors that mean "no GPU for you now" (spaces zero/client.py); anything else is a real failure
NO_GPU = ("ZeroGPU quota exceeded", "ZeroGPU queue timeout", "ZeroGPU illegal duration", "ZeroGPU client error",
          "ZeroGPU pending credits exceeded", "ZeroGPU worker error")


def _gpu_decorator() -> Callable[[Callable], Callable]:
    try:
        import spaces  # noqa: PLC0415 (optional: a Space installs it; it patches torch on ZeroGPU)
    except Exception:  # not installed, or a ZeroGPU environment without its device API
        return lambda fn: fn
    return spaces.GPU(duration=GPU_DURATION_S)


def _chunk(runs_dir: str, run_id: str, seconds: float) -> Chunk:
    """One chunk, in ZeroGPU's forked GPU process (plain arguments and result: they are pickled)."""
    return run_chunk(runs_dir, run_id, seconds)


gpu_chunk = _gpu_decorator()(_chunk)  # decorated at import, before the app launches (spaces' start-up report)


def gpu_available() -> bool:
    """Whether a Train on GPU button belongs on the page: on a ZeroGPU Space."""
    return detect().kind == "zerogpu-space"


def no_gpu_reason(exc: BaseException) -> Optional[str]:
    """The sentence's cause when `exc` means no GPU can be had now; None for any other error."""
    title = str(getattr(exc, "title", "") or "")
    message = " ".join(str(getattr(exc, "message", "") or exc).split())
    if title in NO_GPU or message.startswith("No GPU was available"):
        return f"{title or 'ZeroGPU'}: {message}"[:300]
    return None


def _to_cpu(ctx: AppContext, run_id: str, owner: str) -> int:
    """Hand a run the GPU path left queued (for its first or next chunk) to the CPU queue, which goes on from
    its last checkpoint; the step it goes on from."""
    status = ctx.store.status(run_id)
    if status.get("state") != "queued":
        return int(status.get("step") or 0)
    ctx.jobs.adopt(run_id, owner)
    return int(status.get("continue_from") or 0)


def train_on_gpu(ctx: AppContext, cfg: RunConfig, owner: str) -> Iterator[tuple[str, str]]:
    """Create the run and train it in GPU chunks; yields (run id, a sentence for the page) as it goes. A
    configuration this server has trained or is training is that run, watched, not trained again."""
    claim = ctx.jobs.attach(cfg, owner)
    if claim is not None:
        yield claim.run_id, f"🔁 {describe_claim(claim)}"
        return
    run_id = ctx.jobs.create_outside(cfg, owner)  # the server's limits, as for Start (LimitError naming the limit)
    yield run_id, "⚡ Waiting for a GPU…"
    done = False
    try:
        for chunk in train_in_chunks(ctx.store, run_id, CHUNK_S, call=gpu_chunk):
            done = chunk.done
            where = "the GPU" if chunk.device.startswith("cuda") else f"the {chunk.device.upper()}"
            if chunk.state == "failed":
                yield run_id, f"⚠️ The run failed on {where} at step {chunk.step}: {chunk.error}"
            elif chunk.done:
                yield run_id, f"⚡ Trained on {where} in chunks of {CHUNK_S:.0f} s: {chunk.state} at step {chunk.step}."
            else:
                yield run_id, (f"⚡ Training on {where}, in chunks of {CHUNK_S:.0f} s: step {chunk.step} of "
                               f"{chunk.total}; waiting for the next GPU slot…")
    except Exception as exc:
        reason = no_gpu_reason(exc)
        if reason is None:
            log.exception("GPU training of %s failed", run_id)
        step = _to_cpu(ctx, run_id, owner)
        done = True
        cause = reason or f"the GPU call failed ({type(exc).__name__})"
        yield run_id, f"🐢 No GPU now ({cause}). The run goes on in the CPU queue from step {step}."
    finally:
        if not done:  # the page was closed between chunks: the CPU queue finishes it
            try:
                _to_cpu(ctx, run_id, owner)
            except Exception:
                log.warning("could not hand run %s to the CPU queue", run_id, exc_info=True)


def stop_gpu_run(ctx: AppContext, run_id: str) -> bool:
    """Ask a run that trains in GPU chunks (no job manager knows it) to stop: its chunk stops at its next
    check, or the next chunk at once. True if the run was live."""
    if ctx.store.status(run_id).get("state") not in LIVE_STATES:
        return False
    request_stop(ctx.store, run_id)
    return True


@dataclass(frozen=True)
class GpuOut(Outputs):
    """Train on GPU's outputs: the run picker, the remembered runs, the live timer, the note beside Start."""
    run_pick: Any = kept()
    my_runs: Any = kept()
    timer: Any = kept()
    note: Any = kept()


def wire_gpu_button(ctx: AppContext, button: gr.Button, inputs: list, run_ids: Callable[[list, str], list],
                    view: Any, read_config: Callable[[tuple], RunConfig], problem: Callable[[Exception], str],
                    api_names: list[str]) -> None:
    """Train on GPU's event: a generator from the clicking user's request (ZeroGPU charges the chunks to
    that user), updating the run picker, the remembered runs, the timer and the note beside the buttons
    (`view`'s components named as GpuOut's fields). `run_ids(runs, new)`: the page's remembered runs with
    the new one first."""
    def on_gpu(*args: object):
        *vals, runs, who = args
        try:
            cfg = read_config(tuple(vals))
            steps = train_on_gpu(ctx, cfg, who if isinstance(who, str) else "")
            run_id, text = next(steps)
        except ConfigError as exc:
            yield GpuOut(note=problem(exc)).values()
            return
        listed = run_ids(runs if isinstance(runs, list) else [], run_id)
        yield GpuOut(run_pick=gr.Dropdown(choices=listed, value=run_id), my_runs=listed, timer=gr.Timer(active=True),
                     note=text).values()
        for _, text in steps:
            yield GpuOut(timer=gr.Timer(active=True), note=text).values()

    button.click(with_api_params(on_gpu, api_names), inputs=inputs, outputs=GpuOut.wired(view), api_name="start_gpu",
                 preprocess=False, concurrency_limit=None, show_progress="hidden")
