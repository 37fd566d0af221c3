"""Whether the process that wrote a run still lives: a lock file each writer holds for life.

A process that stamps a live status (queued, running) or names a temp file after itself first
takes, once per store, an exclusive OS lock (`filelock.FileLock`: flock on POSIX, LockFileEx on
Windows) on `<root>/.locks/<token>.lock` and holds it until it exits. The token
(`w<pid>-<12 hex digits>`) is unique to the process, and the OS drops the lock when the process
ends, however it ends (SIGKILL included): no pid can be mistaken for a reused one and nothing is
parsed out of /proc. A reader asks whether the lock is still held by trying to take it without
waiting, on a descriptor it opens without creating or truncating anything, so asking writes
nothing and works in a store it cannot write to. Locks are per open file, so a second descriptor
in the holder's own process is refused like any other process (the holder answers for itself
from its token without probing).

`writer_alive` answers True (held: the writer lives), False (not held, or the lock file is gone:
the writer died; `sweep_locks` removes such files) or None (cannot tell: the file cannot be
opened, the file system has no native locks, or filelock is older than 3.30). Callers fall back
to the pid check on None. A process forked without exec gets a new token of its own.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any

import filelock

try:  # filelock >= 3.30: the native lock on a descriptor the caller opened
    from filelock import lock_descriptor as _lock_descriptor, unlock_descriptor as _unlock_descriptor
except ImportError:  # pragma: no cover - older filelock: readers fall back to the pid check
    _lock_descriptor = _unlock_descriptor = None

LOCK_DIR = ".locks"
TOKEN = re.compile(r"^w\d+-[0-9a-f]{12}$")
_OPEN_EXTRA = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_guard = threading.Lock()
_state: dict[str, Any] = {"pid": None, "token": "", "held": {}}
_inherited: list[Any] = []  # a forked child's copies of its parent's locks: never released here


def _current() -> dict[str, Any]:
    """This process's token and held locks (a new token after a fork without exec)."""
    pid = os.getpid()
    if _state["pid"] != pid:
        _inherited.extend(_state["held"].values())
        _state.update(pid=pid, token=f"w{pid}-{secrets.token_hex(6)}", held={})
    return _state


def my_token() -> str:
    """This process's writer token."""
    with _guard:
        return _current()["token"]


@functools.lru_cache(maxsize=1)
def _lock_options() -> dict[str, Any]:
    """FileLock options the installed version knows: one object per call, not a per-thread hold,
    and never a soft (existence) lock, which the OS would not drop when the process dies."""
    known = inspect.signature(filelock.FileLock.__init__).parameters
    wanted = {"thread_local": False, "is_singleton": False, "fallback_to_soft": False}
    return {k: v for k, v in wanted.items() if k in known}


def _take(path: Path) -> filelock.BaseFileLock | None:
    """Acquire a process-lifetime native lock on `path`, or None where there are no native locks."""
    soft = filelock.SoftFileLock
    if issubclass(filelock.FileLock, soft):
        return None
    for _ in range(3):
        lock = filelock.FileLock(str(path), timeout=1.0, **_lock_options())
        lock.acquire()
        if isinstance(lock, soft):  # a file system without flock, on a filelock that falls back anyway
            lock.release()
            return None
        if path.exists():
            return lock
        lock.release()  # a sweep removed the file between its creation and the lock: take a new one
    return None


def hold(root: Path) -> str | None:
    """Make sure this process holds its lock in the store at `root` (taken on first need, kept
    until the process exits); return the token, or None if it cannot (read-only store, no
    native locks), in which case writers stamp only pid and process identity."""
    with _guard:
        state = _current()
        key = os.fspath(root)
        path = Path(root) / LOCK_DIR / f"{state['token']}.lock"
        held = state["held"].get(key)
        if held is not None and not path.exists():  # the store was removed (and made anew) under us
            del state["held"][key]
            held.release()
            held = None
        if held is None:
            try:
                path.parent.mkdir(exist_ok=True)
                held = _take(path)
            except (OSError, filelock.Timeout, NotImplementedError):
                return None
            if held is None:
                return None
            state["held"][key] = held
        return state["token"]


def _probe(path: Path) -> bool | None:
    """Whether another open file holds the lock on `path`: True held, False free or missing,
    None unknown. Opens without O_CREAT or O_TRUNC; read-write first (NFS needs it for an
    exclusive lock), read-only where writing is not allowed."""
    if _lock_descriptor is None:
        return None
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, flags | _OPEN_EXTRA)
            break
        except FileNotFoundError:
            return False
        except OSError:
            continue
    if fd is None:
        return None
    try:
        got = _lock_descriptor(fd, blocking=False)
        if got:
            _unlock_descriptor(fd)
        return not got
    except OSError:
        return None
    finally:
        os.close(fd)


def writer_alive(root: Path, token: Any) -> bool | None:
    """Whether the process with writer token `token` still lives (None: cannot tell)."""
    if not isinstance(token, str) or not TOKEN.match(token):
        return None
    if token == my_token():
        return True
    return _probe(Path(root) / LOCK_DIR / f"{token}.lock")


def sweep_locks(root: Path) -> int:
    """Remove the lock files of writers that died (this process's own is kept); return how many.
    A file is unlinked while this process holds its lock, so a live writer never loses it."""
    folder = Path(root) / LOCK_DIR
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    mine, removed = my_token(), 0
    for name in names:
        token = name[:-5] if name.endswith(".lock") else ""
        if not TOKEN.match(token) or token == mine or _lock_descriptor is None:
            continue
        try:
            fd = os.open(folder / name, os.O_RDWR | _OPEN_EXTRA)
        except OSError:
            continue
        try:
            if _lock_descriptor(fd, blocking=False):
                (folder / name).unlink()
                removed += 1
        except OSError:
            pass  # held elsewhere after all, or not removable (Windows: open files stay)
        finally:
            os.close(fd)
    return removed


# ---- pid and start time: status files without a token, stores without native locks ----
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


# ---- what a live status records, and what it says ------------------------------------
def stamp(root: Path) -> dict[str, Any]:
    """This process's stamp for a live status in the store at `root`: pid, start-time identity
    and, once it holds its lock there, its writer token (the lock is taken before the token is
    written anywhere, so a reader never finds a token whose lock is not yet held)."""
    token = hold(root)
    return {"pid": os.getpid(), "proc": process_token(), **({"writer": token} if token else {})}


def stamp_alive(root: Path, status: dict[str, Any]) -> bool:
    """Whether the process that stamped `status` still runs: its lock answers; a status without
    a token (older stores, no native locks) or a lock that cannot be probed falls back to the
    pid plus start time."""
    alive = writer_alive(root, status["writer"]) if "writer" in status else None
    return process_alive(status.get("pid"), status.get("proc")) if alive is None else alive
