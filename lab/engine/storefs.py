"""File-system primitives of the run store: atomic writes, JSON files, process identity.

Kept apart from runs.py so the store reads as what it stores, not how bytes reach a disk.
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{temp_tag()}.", suffix=".tmp")
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


# ---- leftovers of a crash -------------------------------------------------------
_LEFTOVER = re.compile(r"^\..*\.p(\d+)-(\d+)\.[^.]*\.(tmp|new)$")


def temp_tag() -> str:
    """'p<pid>-<start ticks>': names a temp file or folder after its writer, so a later process can
    tell one abandoned by a dead writer (safe to remove) from one being written right now."""
    token = process_token() or str(os.getpid())
    return "p" + token.replace(":", "-") if ":" in token else f"p{token}-0"


def _abandoned(name: str) -> bool:
    m = _LEFTOVER.match(name)
    if m is None:
        return False
    pid, ticks = int(m.group(1)), m.group(2)
    return not process_alive(pid, f"{pid}:{ticks}" if ticks != "0" else None)


def sweep(root: Path) -> int:
    """Remove what crashed writers left in a store: temp files of atomic writes inside run
    folders, half-created run folders (`.<id>.p<pid>-<t>.<rand>.new`) and half-deleted ones
    (`.<id>.<hex>.deleted`). Files of live writers are kept. Returns how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        name = entry.name
        if name.startswith(".") and (name.endswith(".deleted") or _abandoned(name)):
            if entry.is_dir():
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)
            removed += 1
        elif not name.startswith(".") and entry.is_dir(follow_symlinks=False):
            for folder in (Path(entry.path), Path(entry.path) / "attention"):
                for child in folder.glob(".*.tmp") if folder.is_dir() else ():
                    if _abandoned(child.name):
                        child.unlink(missing_ok=True)
                        removed += 1
    return removed


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
