"""File-system primitives of the run store: atomic writes, JSON files, leftovers of crashes.

Kept apart from store.py so the store reads as what it stores, not how bytes reach a disk.
Whether a writer lives (for its statuses and its temp files) is asked of liveness.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors import SafetensorError

from lab.engine.liveness import hold, process_alive, process_token, sweep_locks, writer_alive


class RunIdError(ValueError):
    """A run id that is malformed or would point outside the store."""


class RunNotFoundError(FileNotFoundError):
    """A well-formed run id with no run folder (or a run lacking the asked-for file)."""


class DamagedRunError(ValueError):
    """A run whose config.json, status.json or summary.json cannot be read."""


def now_iso() -> str:
    """UTC wall time as ISO 8601 with milliseconds (sorts lexicographically)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# ---- atomic files -----------------------------------------------------------
def _atomic(path: Path, write: Callable[[str], None], tag: str | None = None) -> None:
    """`write(tmp)` a temp file in the same folder, then os.replace it onto `path`. The temp
    file is named after its writer (`tag`, see `temp_tag`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{tag or temp_tag()}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_write(path: Path, data: bytes, tag: str | None = None) -> None:
    """Bytes to `path` atomically, fsynced before the rename (temp file named after `tag`)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    _atomic(path, write, tag)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.generic, torch.Tensor)):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _dumps(obj: Any, indent: int | None = 2) -> bytes:
    return json.dumps(obj, indent=indent, default=_json_default).encode()


def _read_json(path: Path) -> Any:
    """Parse a JSON object file; DamagedRunError naming the file if missing or garbage."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise DamagedRunError(f"{path.name}: missing") from None
    except (ValueError, UnicodeDecodeError):
        raise DamagedRunError(f"{path.name}: not valid JSON") from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path.name}: not a JSON object")
    return data


def _flatten_summary(prefix: str, data: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """{'eval': {'loss': 1}} -> {'final.eval.loss': 1}; None values are left out."""
    for key, value in data.items():
        if isinstance(value, dict):
            _flatten_summary(f"{prefix}{key}.", value, out)
        elif value is not None:
            out[prefix + key] = value
    return out


def _check_step(step: Any) -> None:
    """ValueError unless `step` is a non-negative int (a snapshot's step names its file)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: {step!r} is not a non-negative integer")


# ---- leftovers of a crash -------------------------------------------------------
_LEFTOVER = re.compile(r"^\..*\.(w\d+-[0-9a-f]{12})\.[^.]*\.(tmp|new)$")
# safetensors' own save_file (0.7+) writes `.tmpXXXXXX` and renames it; earlier versions of this store let it,
# so a SIGKILL mid-save left one with no writer's name. Nothing writes such a name now: any found is dead.
_UNTAGGED_TMP = re.compile(r"^\.tmp[A-Za-z0-9]{6}$")
_LEFTOVER_PID = re.compile(r"^\..*\.p(\d+)-(\d+)\.[^.]*\.(tmp|new)$")  # named before writers held locks


def temp_tag(root: Path | None = None) -> str:
    """Names a temp file or folder after its writer, so a later process can tell one abandoned by
    a dead writer (safe to remove) from one being written right now: this process's writer token
    once it holds its lock in the store at `root`; else 'p<pid>-<start ticks>' (judged by pid)."""
    token = hold(root) if root is not None else None
    if token is not None:
        return token
    ident = process_token() or str(os.getpid())
    return "p" + ident.replace(":", "-") if ":" in ident else f"p{ident}-0"


def _abandoned(name: str, root: Path) -> bool:
    """Whether a temp name's writer is known to be dead: its lock is free (where the lock cannot be
    probed: no process has its pid; a pid that exists keeps the file)."""
    m = _LEFTOVER.match(name)
    if m is not None:
        alive = writer_alive(root, m.group(1))
        return not (process_alive(int(m.group(1)[1:].split("-")[0]), None) if alive is None else alive)
    m = _LEFTOVER_PID.match(name)
    if m is None:
        return False
    pid, ticks = int(m.group(1)), m.group(2)
    return not process_alive(pid, f"{pid}:{ticks}" if ticks != "0" else None)


def sweep(root: Path) -> int:
    """Remove what crashed writers left in a store: temp files of atomic writes inside run
    folders, half-created run folders (`.<id>.<tag>.<rand>.new`), half-deleted ones
    (`.<id>.<hex>.deleted`) and the lock files of dead writers. Files of live writers are kept.
    Returns how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if name.startswith(".") and (name.endswith(".deleted") or _abandoned(name, root)):
            if entry.is_dir():
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)
            removed += 1
        elif not name.startswith(".") and entry.is_dir(follow_symlinks=False):
            for folder in (Path(entry.path), Path(entry.path) / "attention"):
                for child in folder.glob(".*") if folder.is_dir() else ():
                    if _abandoned(child.name, root) or _UNTAGGED_TMP.match(child.name):
                        child.unlink(missing_ok=True)
                        removed += 1
    return removed + sweep_locks(root)


# ---- damage checks that read only a few bytes ---------------------------------------
def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (header length, JSON header, data size), or None.
    Reads the header only; never unpickles or executes anything."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name}: truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                return f"{path.name}: not a safetensors file (bad header length)"
            header = json.loads(fh.read(n))
    except OSError as exc:
        return f"{path.name}: unreadable ({exc.strerror})"
    except (ValueError, UnicodeDecodeError):
        return f"{path.name}: not a safetensors file (header is not JSON)"
    if not isinstance(header, dict):
        return f"{path.name}: not a safetensors file (header is not a JSON object)"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        return f"{path.name}: not a safetensors file (bad tensor entry)"
    if 8 + n + end != size:
        return f"{path.name}: truncated or padded ({size} bytes, the header describes {8 + n + end})"
    return None


def jsonl_problem(path: Path, probe: int = 4096) -> str | None:
    """Whether a JSON-lines file looks like garbage: its first and its last complete line must be
    JSON objects (a cut-off last line, as a crash can leave, is tolerated). Reads <= 2 * probe bytes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            first = fh.read(probe)
            fh.seek(max(0, size - probe))
            last = fh.read(probe)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path.name}: unreadable ({exc.strerror})"
    complete = last[: last.rfind(b"\n")] if b"\n" in last else b""
    lines = [first.split(b"\n", 1)[0] if b"\n" in first else b"", complete.rsplit(b"\n", 1)[-1]]
    for line in lines:
        if not line:
            continue
        try:
            ok = isinstance(json.loads(line), dict)
        except (ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            return f"{path.name}: unreadable lines (they are skipped)"
    return None


def _safe_load(path: Path, load: Any) -> dict[str, Any]:
    """A safetensors file, or DamagedRunError naming it (truncated, garbage, not safetensors)."""
    problem = safetensors_problem(path)
    if problem is None:
        try:
            return load(path)
        except (SafetensorError, OSError, ValueError) as exc:
            problem = f"{path.name}: unreadable ({' '.join(str(exc).split())[:200]})"
    raise DamagedRunError(problem)


def last_step(path: Path, probe: int = 4096) -> int:
    """The step of the last whole record in a metrics file (0 if none): what a run reached even when
    its status, refreshed every few seconds, lags behind. Reads at most `probe` bytes from the end."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            fh.seek(max(0, size - probe))
            tail = fh.read(probe)
    except OSError:
        return 0
    for line in reversed(tail.split(b"\n")):
        try:
            row = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue  # a torn last line, or the cut first one
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            return row["step"]
    return 0
