"""File-system primitives of the run store: atomic writes, JSON files, process identity.

Kept apart from runs.py so the store reads as what it stores, not how bytes reach a disk.
"""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch


class RunIdError(ValueError):
    """A run id that is malformed or would point outside the store."""


class RunNotFoundError(FileNotFoundError):
    """A well-formed run id with no run folder (or a run lacking the asked-for file)."""


class DamagedRunError(ValueError):
    """A run whose config.json, status.json or summary.json cannot be read."""


def now_iso() -> str:
    """UTC wall time as ISO 8601 with milliseconds (sorts lexicographically)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# ---- process identity -------------------------------------------------------
def process_token(pid: int | None = None) -> str | None:
    """'pid:start_ticks' from /proc/<pid>/stat (field 22); None if the process is gone or
    a zombie; 'pid' alone where there is no /proc."""
    pid = os.getpid() if pid is None else pid
    if not os.path.isdir("/proc/self"):
        return str(pid) if _pid_exists(pid) else None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            after_comm = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if after_comm[0] in (b"Z", b"X"):  # field 3: zombie or dead
        return None
    return f"{pid}:{after_comm[19].decode()}"  # field 22 = index 19 after the comm field


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return True


def process_alive(pid: Any, token: Any) -> bool:
    """Whether the process that wrote a status (pid + identity token) still runs."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    if isinstance(token, str) and ":" in token and os.path.isdir("/proc/self"):
        return process_token(pid) == token
    return _pid_exists(pid)


# ---- atomic files -----------------------------------------------------------
def _atomic(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` a temp file in the same folder, then os.replace it onto `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_write(path: Path, data: bytes) -> None:
    """Bytes to `path` atomically, fsynced before the rename."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    _atomic(path, write)


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
