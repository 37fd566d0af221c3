"""The messages between the job manager and a worker process (pickled over two pipes).

App -> worker: `RunJob` (train these queued runs; one, or a batched group), `StopRun` (stop one of them at
its next step). Worker -> app: `Progress` (a run's latest step record, for live status) and `Finished`
(how a run ended, once per run; the worker has recorded everything in the store by then).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from lab.records import StepRecord


@dataclass(frozen=True)
class RunJob:
    root: str  # the run store's folder
    run_ids: tuple[str, ...]
    threads: int  # intra-op CPU threads for the job
    train_fn: Optional[Callable[..., Any]] = None  # a module-level trainer (tests); None = lab.trainer.train


@dataclass(frozen=True)
class StopRun:
    run_id: str


@dataclass(frozen=True)
class Progress:
    run_id: str
    record: StepRecord


@dataclass(frozen=True)
class Finished:
    run_id: str
    state: str  # completed, stopped or failed
    error: Optional[str] = None


ToWorker = Union[RunJob, StopRun]
FromWorker = Union[Progress, Finished]
