"""Runs that survive a restart: each finished run is copied to a backup folder, and a starting app
restores from it the runs its store lacks.

On a Hugging Face Space the disk is wiped on restart, and persistent storage is a Storage Bucket mounted
as a folder. Such a mount has no file locks, holds a file's writes in memory until it is closed (an
append is a whole new upload), and may serve reads that are seconds stale (huggingface/hf-mount README,
"Consistency model"). So the backup never appends and needs no lock: every file is written whole, once
(open, write, close), and a manifest of every file's size and SHA-256 is written last. A run is restored
only when each of its files matches its manifest; a backup caught half-written (or read stale) is left
for the next start. The live store stays on local disk (lab/engine/store.py): appends, locks and atomic
renames work there.

Layout: `<backup>/<run id>/<the run folder's files>` and `<backup>/<run id>/backup-manifest.json`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lab.engine.store import RunStore
from lab.engine.storefs import RunIdError, temp_tag

log = logging.getLogger("lab.backup")
MANIFEST = "backup-manifest.json"
ENV = "LAB_BACKUP_DIR"


def backup_dir(env: Optional[dict[str, str]] = None) -> Optional[Path]:
    """The backup folder named by LAB_BACKUP_DIR (on a Space: the mounted bucket), or None."""
    value = (os.environ if env is None else env).get(ENV, "").strip()
    return Path(value).expanduser() if value else None


def run_files(folder: Path) -> list[Path]:
    """A run folder's files (nested too), not temp files (a name starting with '.') nor the manifest."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def file_entry(data: bytes) -> dict[str, object]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_once(path: Path, data: bytes) -> None:
    """One open, one write, one close: what a bucket mount uploads as a whole object."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def read_manifest(folder: Path) -> Optional[dict[str, dict[str, object]]]:
    """{relative path: {size, sha256}} of a backed-up run, or None without a readable manifest."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
        return data["files"] if isinstance(data, dict) and isinstance(data.get("files"), dict) else None
    except (OSError, ValueError, KeyError):
        return None


def backup_run(store: RunStore, run_id: str, dest: Path) -> bool:
    """Copy a finished run to `dest`/<run id>: its files whole, then the manifest. Unchanged files (by
    the previous manifest) are not written again. True when something was written."""
    src = store.path(run_id)
    target = dest / run_id
    before = read_manifest(target) or {}
    files = {}
    for path in run_files(src):
        rel = path.relative_to(src).as_posix()
        data = path.read_bytes()
        files[rel] = file_entry(data)
        if before.get(rel) != files[rel]:
            _write_once(target / rel, data)
    if before == files:
        return False
    for rel in set(before) - set(files):  # a file the run no longer has (a continuation replaced it)
        (target / rel).unlink(missing_ok=True)
    _write_once(target / MANIFEST, json.dumps({"run_id": run_id, "files": files}, indent=1).encode())
    return True


def forget(run_id: str, dest: Path) -> None:
    """Remove a deleted run's backup (else the next start would bring it back): the manifest first, so
    a removal cut short leaves no restorable half."""
    target = dest / run_id
    (target / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)


@dataclass(frozen=True)
class Restored:
    """What `restore` did: runs brought back, and runs whose backup did not match its manifest."""

    runs: tuple[str, ...]
    incomplete: tuple[str, ...]


def _verified(folder: Path) -> Optional[dict[str, bytes]]:
    """The backed-up files of a run, or None when any is missing or differs from the manifest."""
    manifest = read_manifest(folder)
    if not manifest:
        return None
    out = {}
    for rel, want in manifest.items():
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            return None
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if file_entry(data) != want:
            return None
        out[rel] = data
    return out


def restore(store: RunStore, src: Path) -> Restored:
    """Bring back every backed-up run the store lacks (a fresh disk after a restart): verified against
    its manifest, written into a temp folder of the store, then renamed in whole."""
    runs, incomplete = [], []
    try:
        entries = sorted(e for e in src.iterdir() if e.is_dir() and not e.name.startswith("."))
    except FileNotFoundError:
        return Restored((), ())
    for folder in entries:
        try:
            final = store.path(folder.name)
        except RunIdError:
            continue
        if final.exists():
            continue
        files = _verified(folder)
        if files is None:
            incomplete.append(folder.name)
            log.warning("backup of %s does not match its manifest; left for the next start", folder.name)
            continue
        store.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=store.root, prefix=f".{folder.name}.{temp_tag(store.root)}.",
                                    suffix=".new"))
        try:
            for rel, data in files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        runs.append(folder.name)
    return Restored(tuple(runs), tuple(incomplete))
