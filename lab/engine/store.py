"""The run store: one folder per run, and the only code that knows paths.

Layout of `<root>/<run_id>/`: `config.json` (written once), `status.json` (rewritten
atomically), `metrics.jsonl` (one JSON line per train/eval record, append-only),
`weights.safetensors`, `attention/step_0000100.safetensors` (the probe's attention and, for models up to
1M parameters, float16 weights at that step), `summary.json`, and the latest
`checkpoint.safetensors` (written and read by continuation.py, which continues a run in its folder).
A run is built in a dot-folder and renamed into place, so a crash never leaves a
half-written run; every JSON file is replaced atomically, so readers never see a torn
file. A queued or running run whose writing process died reads as "interrupted": each writer
holds a lock for its lifetime and stamps its token in status.json (liveness.py); reading never
writes, and `recover()` at start-up records those runs as interrupted. Temp files and folders
are named after their writer, so `sweep()` at start-up removes exactly what crashed writers
left. Listing flags damaged runs (unreadable JSON, garbage metrics, a truncated or foreign
weights file) with the reason instead of failing; weights are safetensors, which load tensors
only and never execute code.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from lab.config import RECURRENT, ConfigError, RunConfig, flatten
from lab.records import EvalRecord, StepRecord
from lab.engine.liveness import stamp, stamp_alive
from lab.engine.tensors import RunTensors
from lab.engine.storefs import (DamagedRunError, RunIdError, RunNotFoundError, _atomic_write,
                                _dumps, _flatten_summary, _read_json, jsonl_problem, last_step, now_iso,
                                safetensors_problem, sweep, temp_tag)

RUN_STATES = ("queued", "running", "completed", "stopped", "failed", "interrupted")
LIVE_STATES = ("queued", "running")
TERMINAL_STATES = ("completed", "stopped", "failed", "interrupted")
FINISHED_STATES = ("completed", "stopped")  # ended with a final evaluation (a stopped run is evaluated as it stops)
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RECORD_KINDS = {StepRecord: "train", EvalRecord: "eval"}
_METRIC_COLUMNS = list(dict.fromkeys(["kind", "step", *(f.name for r in _RECORD_KINDS for f in dataclasses.fields(r))]))
_BASE_COLUMNS = ["run_id", "state", "owner", "created_at", "updated_at", "step", "error", "damaged",
                 "seed_from", "code_version"]  # the last two: a class seed, the code that trained it (sharing.py)
_STATUS_COLUMNS = frozenset(_BASE_COLUMNS) - {"run_id", "damaged"}
_MAX_OPEN_HANDLES = 64


@functools.lru_cache(maxsize=1)
def _config_columns() -> tuple[str, ...]:
    return tuple(flatten(RunConfig()))


class RunStore(RunTensors):
    """A folder of runs. Thread-safe within a process; one writer process per run."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        root = root if root is not None else os.environ.get("LAB_RUNS_DIR") or "runs"
        self.root: Path = Path(root).expanduser().resolve()
        self._lock = threading.RLock()
        self._handles: OrderedDict[str, BinaryIO] = OrderedDict()

    # ---- ids and paths ----------------------------------------------------
    def new_run_id(self, cfg: RunConfig) -> str:
        """'20261122-025300-reverse-rope-pre-a1b2c3': UTC time, task, pos, norm (a recurrent model: its
        architecture, 'reverse-lstm'), random hex."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        m = cfg.model
        kind = m.arch if m.arch in RECURRENT else f"{m.pos}-{m.norm}"
        while True:
            run_id = f"{stamp}-{cfg.task.name}-{kind}-{secrets.token_hex(3)}"
            if not (self.root / run_id).exists():
                return run_id

    def path(self, run_id: str) -> Path:
        """The run's folder; RunIdError for anything that is not a plain id inside root."""
        ok = isinstance(run_id, str) and _RUN_ID.match(run_id) and ".." not in run_id
        if ok:
            path = (self.root / run_id).resolve()
            ok = path.parent == self.root
        if not ok:
            raise RunIdError(
                f"run_id: {run_id!r} is not a valid run id (allowed: letters, digits, '.', '_', "
                "'-'; 1 to 128 characters starting with a letter or digit; no '..')"
            )
        return path

    def _existing(self, run_id: str) -> Path:
        path = self.path(run_id)
        if not path.is_dir():
            raise RunNotFoundError(f"run_id: {run_id!r} does not exist in this run store")
        return path

    def exists(self, run_id: str) -> bool:
        return self.path(run_id).is_dir()

    # ---- creation, config, status -----------------------------------------
    def create(self, cfg: RunConfig, owner: str = "", run_id: str | None = None, **status_fields: Any) -> str:
        """Write config.json and a queued status.json (with `status_fields`: its identity and code version,
        lab/engine/sharing.py) in a dot-folder, then rename it in."""
        if not isinstance(cfg, RunConfig):
            raise ConfigError("config", f"expected a RunConfig, got {type(cfg).__name__}")
        if not isinstance(owner, str) or len(owner) > 200:
            raise ValueError("owner: must be a string of at most 200 characters")
        self.root.mkdir(parents=True, exist_ok=True)
        run_id = self.new_run_id(cfg) if run_id is None else run_id
        final = self.path(run_id)
        if final.exists():
            raise ValueError(f"run_id: {run_id!r} already exists in this run store")
        tag = temp_tag(self.root)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{run_id}.{tag}.", suffix=".new"))
        try:
            _atomic_write(tmp / "config.json", cfg.to_json().encode(), tag)
            created = now_iso()
            status = {"state": "queued", "owner": owner, "created_at": created, "updated_at": created,
                      "step": 0, "error": None, **status_fields, **stamp(self.root)}
            _atomic_write(tmp / "status.json", _dumps(status), tag)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return run_id

    def write_json(self, run_id: str, name: str, data: Any) -> None:
        """Replace one small JSON file of the run's folder atomically (holders.json: lab/engine/sharing.py)."""
        if not re.fullmatch(r"[a-z_]+\.json", name) or name in ("config.json", "status.json", "summary.json"):
            raise ValueError(f"name: {name!r} is not a side file of a run")
        _atomic_write(self._existing(run_id) / name, _dumps(data), temp_tag(self.root))

    def config(self, run_id: str) -> RunConfig:
        data = _read_json(self._existing(run_id) / "config.json")
        try:
            return RunConfig.from_dict(data)
        except (ConfigError, TypeError) as exc:
            raise DamagedRunError(f"config.json: {exc}") from None

    def set_status(self, run_id: str, state: str, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into status.json atomically and return the new status. A live
        state (queued, running) is stamped with this process's identity (liveness.stamp) unless
        `fields` names a pid itself."""
        if state not in RUN_STATES:
            raise ValueError(f"state: {state!r} is not one of {', '.join(RUN_STATES)}")
        path = self._existing(run_id) / "status.json"
        with self._lock:
            try:
                status = _read_json(path)
            except DamagedRunError:
                status = {}
            if state in ("stopped", "failed", "interrupted") and "step" not in fields:  # ended outside the
                fields["step"] = max(int(status.get("step") or 0), last_step(path.parent / "metrics.jsonl"))  # loop
            status.update(fields, state=state, updated_at=now_iso())
            if state in LIVE_STATES and "writer" not in fields:
                status.pop("writer", None)  # a previous writer's token must not vouch for this one
                if "pid" not in fields:
                    status.update(stamp(self.root))
            _atomic_write(path, _dumps(status), temp_tag(self.root))
            if state in TERMINAL_STATES:
                self._close_handle(run_id)
        return status

    def status(self, run_id: str) -> dict[str, Any]:
        """Parsed status.json; a live state whose process died reads as 'interrupted'. Reading
        writes nothing: `recover()` records such runs."""
        return self._view(run_id, _read_json(self._existing(run_id) / "status.json"))

    def _view(self, run_id: str, status: dict[str, Any]) -> dict[str, Any]:
        """`status`, or a copy showing a live state whose process died as interrupted, at the last step its
        metrics reached (the status's own step is refreshed only every few seconds)."""
        was = status.get("state")
        if was in LIVE_STATES and not stamp_alive(self.root, status):
            status = {**status, "state": "interrupted", "error": status.get("error") or f"process died while {was}",
                      "step": max(int(status.get("step") or 0), last_step(self.path(run_id) / "metrics.jsonl"))}
        return status

    def recover(self) -> list[str]:
        """Record as "interrupted" every queued or running run whose process died (what `status`
        reports without writing); call once at start-up. Returns their ids; a run that cannot be
        written (read-only store) is left as it is and still reads interrupted."""
        recovered = []
        for run_id in self.run_ids():
            with self._lock:
                try:
                    status = _read_json(self._existing(run_id) / "status.json")
                    view = self._view(run_id, status)
                    if view is not status:
                        self.set_status(run_id, "interrupted", error=view["error"])
                        recovered.append(run_id)
                except (DamagedRunError, OSError):
                    continue  # damaged, deleted meanwhile, or not writable
        return recovered

    # ---- metrics ------------------------------------------------------------
    def append(self, run_id: str, record: StepRecord | EvalRecord) -> None:
        """Append one JSON line to metrics.jsonl with a single write() call."""
        kind = _RECORD_KINDS.get(type(record))
        if kind is None:
            raise TypeError(f"record: expected a StepRecord or EvalRecord, got {type(record).__name__}")
        line = _dumps({"kind": kind, **dataclasses.asdict(record)}, indent=None) + b"\n"
        with self._lock:
            fh = self._handles.get(run_id)
            if fh is None:
                fh = self._open_metrics(run_id)
            self._handles.move_to_end(run_id)
            fh.write(line)  # unbuffered O_APPEND: one write, nothing left to flush

    def _open_metrics(self, run_id: str) -> BinaryIO:
        path = self._existing(run_id) / "metrics.jsonl"
        fh = open(path, "ab+", buffering=0)  # noqa: SIM115 (cached, closed in close())
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":  # a torn last line from a crash: end it
                fh.write(b"\n")
        self._handles[run_id] = fh
        while len(self._handles) > _MAX_OPEN_HANDLES:
            self._handles.popitem(last=False)[1].close()
        return fh

    def _close_handle(self, run_id: str) -> None:
        with self._lock:
            fh = self._handles.pop(run_id, None)
            if fh is not None:
                fh.close()

    def release(self, run_id: str) -> None:
        """Close the run's cached metrics handle, if any (before its metrics file is replaced)."""
        self._close_handle(run_id)

    def close(self) -> None:
        """Close every cached metrics handle (they reopen on the next append)."""
        with self._lock:
            while self._handles:
                self._handles.popitem()[1].close()

    def metrics(self, run_id: str) -> pd.DataFrame:
        """All metric lines as a table (kind, step, record fields); torn lines are skipped."""
        path = self._existing(run_id) / "metrics.jsonl"
        rows = []
        for line in path.read_bytes().splitlines() if path.exists() else ():
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(row, dict) and row.get("kind") in ("train", "eval") and "step" in row:
                rows.append(row)
        frame = pd.DataFrame(rows, columns=None if rows else _METRIC_COLUMNS)
        extra = [c for c in frame.columns if c not in _METRIC_COLUMNS]
        return frame.reindex(columns=_METRIC_COLUMNS + extra)

    def write_summary(self, run_id: str, summary: dict[str, Any]) -> None:
        if not isinstance(summary, dict):
            raise TypeError(f"summary: expected a dict, got {type(summary).__name__}")
        _atomic_write(self._existing(run_id) / "summary.json", _dumps(summary), temp_tag(self.root))

    def summary(self, run_id: str) -> dict[str, Any] | None:
        path = self._existing(run_id) / "summary.json"
        return _read_json(path) if path.exists() else None

    def sweep(self) -> int:
        """Remove temp files, half-created or half-deleted folders and lock files left by
        crashed writers."""
        return sweep(self.root)

    # ---- listing and deletion -------------------------------------------------
    def run_ids(self) -> list[str]:
        """The run folders' names, sorted: not temp folders, stray files or links (never
        followed out of the store)."""
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        return [e.name for e in entries if not e.name.startswith(".") and _RUN_ID.match(e.name)
                and ".." not in e.name and e.is_dir(follow_symlinks=False)]

    def list(self) -> pd.DataFrame:
        """One row per run: status columns, `damaged`, flattened config, `final.*` summary."""
        rows = []
        for run_id in self.run_ids():
            try:
                rows.append(self._row(run_id))
            except RunNotFoundError:
                continue  # deleted while we listed
        columns = _BASE_COLUMNS + list(_config_columns())
        columns += sorted({k for row in rows for k in row if k.startswith("final.")})
        frame = pd.DataFrame(rows, columns=columns)
        return frame.sort_values(["created_at", "run_id"], na_position="last", kind="stable").reset_index(drop=True)

    def _row(self, run_id: str) -> dict[str, Any]:
        """A listing row; unreadable files are named in `damaged` instead of raising."""
        row: dict[str, Any] = {"run_id": run_id}
        problems = []
        for part in (
            lambda: {k: v for k, v in self.status(run_id).items() if k in _STATUS_COLUMNS},
            lambda: flatten(self.config(run_id)),
            lambda: _flatten_summary("final.", self.summary(run_id) or {}, {}),
        ):
            try:
                row.update(part())
            except RunNotFoundError:
                raise  # deleted while we listed
            except (DamagedRunError, OSError) as exc:
                problems.append(str(exc))
        folder = self.root / run_id
        weights = folder / "weights.safetensors"
        if weights.exists():
            problems.append(safetensors_problem(weights) or "")
        elif row.get("state") in ("completed", "stopped") and "final.steps" in row:
            problems.append("weights.safetensors: missing")
        problems.append(jsonl_problem(folder / "metrics.jsonl") or "")
        row["damaged"] = "; ".join(p for p in problems if p)
        return row

    def holders(self, run_id: str, status: dict[str, Any] | None = None) -> list[str]:
        """Who holds the run (may stop or delete it on a shared server): holders.json, written by the job
        manager when students attach to it (lab/engine/sharing.py), else its first starter (status owner)."""
        try:
            data = json.loads((self.path(run_id) / "holders.json").read_text())
            if isinstance(data, list):
                return [h for h in data if isinstance(h, str)]
        except (OSError, ValueError):
            pass
        try:
            status = self.status(run_id) if status is None else status
        except (DamagedRunError, RunNotFoundError):
            return []
        return [str(status.get("owner") or "")]

    def delete(self, run_id: str, owner: str | None = None) -> None:
        """Remove a run's folder. Refuses a run queued or running in a live process, and,
        when `owner` is given, a run that `owner` does not hold (lab/engine/sharing.py)."""
        path = self._existing(run_id)
        try:
            status = self.status(run_id)
        except DamagedRunError:
            status = {}
        if owner is not None and owner not in self.holders(run_id, status):
            raise PermissionError(f"run_id: {run_id!r} belongs to another user; you can delete only your own runs")
        if status.get("state") in LIVE_STATES:
            raise ValueError(f"run_id: {run_id!r} is {status['state']}; stop it before deleting")
        self._close_handle(run_id)
        doomed = self.root / f".{run_id}.{secrets.token_hex(3)}.deleted"
        os.rename(path, doomed)  # vanish from listings at once, then remove
        shutil.rmtree(doomed, ignore_errors=True)
