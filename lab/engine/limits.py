"""Server limits for a shared (classroom) server: read from environment variables once, checked
when a run is submitted, and used to bound what live views hold in memory.

`LAB_PUBLIC=1` switches to classroom defaults and turns on ownership (a user may stop or delete
only their own runs). Each limit can be set on its own:

| variable                  | local default | public default | what it bounds                          |
|---------------------------|---------------|----------------|-----------------------------------------|
| LAB_MAX_RUNS_PER_USER     | 0 (no limit)  | 10             | one user's runs queued or running       |
| LAB_MAX_QUEUE             | 1000          | 40             | runs waiting in the queue, all users    |
| LAB_MAX_PARAMS            | 50,000,000    | 2,000,000      | parameters of one model                 |
| LAB_MAX_STEPS             | 1,000,000     | 5,000          | training steps of one run               |
| LAB_MAX_LIVE_POINTS       | 2000          | 500            | points per curve sent to a live plot    |
| LAB_MAX_UPLOAD_KB         | 64            | 64             | an uploaded config JSON file            |
| LAB_SHARE_RUNS            | 1 (on)        | 1 (on)         | 0: every request trains anew            |

The largest preset launches 10 runs, hence the public default of 10 per user; a preset or grid is
admitted whole or refused whole. The queue is fair (lab/engine/jobs.py): a free slot goes to the oldest
run of the user with the fewest runs training, so one user's ten runs do not hold back the class.

With LAB_SHARE_RUNS on, a request for a configuration the server has trained, is training or has queued
watches that run instead of training a copy (lab/engine/sharing.py), so the limits count distinct
trainings, not clicks; off, every click trains (what a benchmark compares against).

A refused request raises `LimitError` (a `ConfigError`, so every caller already turns it into a
one-line message) naming the limit, its variable and what to do instead.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional


from lab.config import ConfigError, RunConfig

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class LimitError(ConfigError):
    """A request refused by one of the server's limits (`field` names the limit or config field)."""


@dataclass(frozen=True)
class Limits:
    """What one server allows. 0 for `max_runs_per_user` means no per-user limit."""

    public: bool = False  # ownership enforced: stop/delete only one's own runs
    max_runs_per_user: int = 0
    max_queue: int = 1000
    max_params: int = 50_000_000
    max_steps: int = 1_000_000
    max_live_points: int = 2000
    max_upload_kb: int = 64
    share_runs: bool = True  # one training per configuration, watched by everyone who asks (sharing.py)

    def __post_init__(self) -> None:
        for name, var in (("public", "LAB_PUBLIC"), ("share_runs", "LAB_SHARE_RUNS")):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(var, f"{getattr(self, name)!r} is not a boolean")
        for f in fields(self):
            if f.name in ("public", "share_runs"):
                continue
            value, lo = getattr(self, f.name), 0 if f.name == "max_runs_per_user" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ConfigError(ENV_NAMES[f.name], f"{value!r} is not an integer >= {lo}")

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_kb * 1024

    @classmethod
    def public_defaults(cls) -> "Limits":
        return cls(public=True, max_runs_per_user=10, max_queue=40, max_params=2_000_000, max_steps=5000,
                   max_live_points=500)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Limits":
        """Limits from LAB_PUBLIC and LAB_MAX_*; ConfigError naming the variable for a bad value."""
        env = os.environ if env is None else env
        flag = env.get("LAB_PUBLIC", "").strip().lower()
        share = env.get("LAB_SHARE_RUNS", "1").strip().lower() or "1"
        for var, value in (("LAB_PUBLIC", flag), ("LAB_SHARE_RUNS", share)):
            if value not in _TRUE + _FALSE:
                raise ConfigError(var, f"{value!r} is not one of 1, 0, true, false, yes, no")
        base = cls.public_defaults() if flag in _TRUE else cls()
        values: dict = {"share_runs": share in _TRUE}
        for name, var in ENV_NAMES.items():
            text = env.get(var, "").strip().replace("_", "")
            if text:
                if not text.isdigit():
                    raise ConfigError(var, f"{env[var]!r} is not a non-negative integer")
                values[name] = int(text)
        return cls(**{f.name: getattr(base, f.name) for f in fields(cls)} | values)


ENV_NAMES = {"max_runs_per_user": "LAB_MAX_RUNS_PER_USER", "max_queue": "LAB_MAX_QUEUE",
             "max_params": "LAB_MAX_PARAMS", "max_steps": "LAB_MAX_STEPS",
             "max_live_points": "LAB_MAX_LIVE_POINTS", "max_upload_kb": "LAB_MAX_UPLOAD_KB"}


def count_params(cfg: RunConfig) -> int:
    """Trainable parameters of the config's model, from the closed-form count (no model built)."""
    from lab.params import param_breakdown

    return sum(param_breakdown(cfg).values())


def check_config(limits: Limits, cfg: RunConfig) -> None:
    """Refuse a config larger than the server allows (steps, then parameters)."""
    if cfg.train.steps > limits.max_steps:
        raise LimitError("train.steps", f"{cfg.train.steps:,} steps is above this server's limit of "
                         f"{limits.max_steps:,} ({ENV_NAMES['max_steps']}); choose at most {limits.max_steps:,}")
    params = count_params(cfg)
    if params > limits.max_params:
        raise LimitError("model", f"{params:,} parameters is above this server's limit of {limits.max_params:,} "
                         f"({ENV_NAMES['max_params']}); make d_model, d_ff or n_layers smaller")


def check_admission(limits: Limits, cfg: RunConfig, owner: str, owner_live: int, queued: int, n: int = 1) -> None:
    """Refuse `n` new runs (a preset or grid, checked whole) including `cfg` for `owner`, who has
    `owner_live` runs queued or running, when `queued` runs already wait in the queue. Config limits
    first, then the user's, then the queue's."""
    check_config(limits, cfg)
    check_owner(limits, owner)
    cap = limits.max_runs_per_user
    if cap and owner_live + n > cap:
        asking = f"; this asks for {n} more" if n > 1 else ""
        raise LimitError("runs per user", f"you already have {owner_live} run(s) queued or running{asking} and "
                         f"this server allows {cap} at once ({ENV_NAMES['max_runs_per_user']}); wait for one to "
                         "finish or stop one, then start again")
    if queued + n > limits.max_queue:
        asking = f" and this asks for {n}" if n > 1 else ""
        raise LimitError("queue", f"the queue is full ({queued} runs waiting{asking}; this server allows "
                         f"{limits.max_queue}, {ENV_NAMES['max_queue']}); try again in a minute")


def check_owner(limits: Limits, owner: object) -> None:
    """Refuse a request without a user token on a shared server, or with an owner no store would keep."""
    if not isinstance(owner, str) or len(owner) > 200:  # not a user's mistake: no knob's note, an error
        raise ValueError("owner: must be a string of at most 200 characters")
    if limits.public and not valid_owner(owner):
        raise LimitError("owner", "this shared server needs a user token: reload the page (allowed: 8 to 64 "
                         "letters, digits, '_' or '-')")


def valid_owner(owner: object) -> bool:
    """A user token: 8 to 64 characters from letters, digits, '_' and '-' (a uuid4 hex is 32)."""
    return (isinstance(owner, str) and 8 <= len(owner) <= 64
            and all(c.isascii() and (c.isalnum() or c in "_-") for c in owner))
