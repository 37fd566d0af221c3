"""Lesson bundles: finished runs in one file, so a Space or a classroom app starts with every answer ready.

A teacher trains every preset once, the night before, on a laptop or a GPU (`python -m lab bundle --all`:
lab/cli/bundle.py), into one zip file; an app started with `LAB_BUNDLE=lesson.zip` (a file, a folder of
them, or several separated by the path separator) loads its runs into its store before the first page, so
every preset card has its answer and Compare and Inspect (attention snapshots, interventions, circuits)
work on those runs with no training at all. A class that clicks a preset then attaches to the bundle's runs
when they were built with this code (lab/engine/sharing.py); runs from another lab version are shown, and
labelled with the version that trained them, but a click trains this code's own.

What a bundle keeps is what the views read: each run's config, status, summary, metrics, final weights and
attention snapshots (with their small float16 weights). It leaves out the checkpoint (weights and AdamW
moments to continue training: three times the weights) and who held the run (`holders.json`).

Layout: `bundle.json` ({"format", "code_version", "created_at", "presets", "runs": {run id: {relative path:
{size, sha256}}}}), then `<run id>/<relative path>` for each file. Loading checks every member's name (a run
id, then a plain relative path: nothing outside the run's folder), size and SHA-256 before it writes,
extracts each run into a temp folder of the store and renames it in whole: a damaged bundle writes nothing
of the run it damages, and a run the store already has is left as it is. Bundled runs belong to no student
(owner ""): on a shared server nobody but the admin can delete them.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping, Optional, Sequence

from lab.engine.backup import file_entry, run_files
from lab.engine.identity import code_version
from lab.engine.store import FINISHED_STATES, RunStore
from lab.engine.storefs import RunIdError, _atomic_write, _dumps, now_iso, temp_tag

ENV = "LAB_BUNDLE"
FORMAT = 1
MANIFEST = "bundle.json"
TENSORS = ".safetensors"  # weights and attention snapshots: float data that deflate barely shrinks
LEFT_OUT = ("checkpoint.safetensors", "holders.json")  # not needed to show a run
MAX_BYTES = 4 * 2**30  # a bundle unpacks to at most this much (a zip bomb is refused before anything is written)


class BundleError(ValueError):
    """A file that is not a lesson bundle, or one whose contents do not match its manifest."""


@dataclass(frozen=True)
class Loaded:
    """What `load_bundle` did: runs written into the store, runs the store had already."""

    runs: tuple[str, ...]
    present: tuple[str, ...]
    code_version: str


def bundle_paths(env: Optional[Mapping[str, str]] = None, backup: Optional[Path] = None) -> list[Path]:
    """The bundle files in the `bundles` folder of the backup folder (LAB_BACKUP_DIR: a Space's storage
    bucket), if it has one, then those LAB_BUNDLE names (each entry a .zip file or a folder of them, sorted)."""
    value = (os.environ if env is None else env).get(ENV, "").strip()
    out: list[Path] = sorted((backup / "bundles").glob("*.zip")) if backup is not None else []
    for part in filter(None, (p.strip() for p in value.split(os.pathsep))):
        path = Path(part).expanduser()
        out += sorted(path.glob("*.zip")) if path.is_dir() else [path]
    return list(dict.fromkeys(out))


def write_bundle(store: RunStore, run_ids: Sequence[str], dest: Path, presets: Sequence[str] = ()) -> int:
    """Write the finished runs `run_ids` into the bundle file `dest` (atomically); returns its size in bytes.
    BundleError for a run that has not finished (a bundle holds answers, not promises)."""
    runs: dict[str, dict[str, dict[str, object]]] = {}
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{temp_tag()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
            for run_id in dict.fromkeys(run_ids):
                state = store.status(run_id).get("state")
                if state not in FINISHED_STATES:
                    raise BundleError(f"run {run_id} is {state}: only finished runs go into a bundle")
                folder, files = store.path(run_id), {}
                for path in run_files(folder):
                    rel = path.relative_to(folder).as_posix()
                    if rel in LEFT_OUT:
                        continue
                    data = path.read_bytes()
                    files[rel] = file_entry(data)
                    # tensors are stored as they are: deflate saved 8 to 10% of them at most of the bundle's time
                    zf.writestr(f"{run_id}/{rel}", data,
                                compress_type=zipfile.ZIP_STORED if rel.endswith(TENSORS) else None)
                runs[run_id] = files
            manifest = {"format": FORMAT, "code_version": code_version(), "created_at": now_iso(),
                        "presets": list(presets), "runs": runs}
            zf.writestr(MANIFEST, json.dumps(manifest, indent=1))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest.stat().st_size


def read_manifest(zf: zipfile.ZipFile) -> dict:
    """The bundle's manifest, checked: format, runs by valid relative paths, sizes within MAX_BYTES."""
    try:
        manifest = json.loads(zf.read(MANIFEST))
    except (KeyError, ValueError) as exc:
        raise BundleError(f"{MANIFEST}: missing or not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("runs"), dict):
        raise BundleError(f"{MANIFEST}: not a lesson bundle of format {FORMAT}")
    total = 0
    for run_id, files in manifest["runs"].items():
        if not isinstance(files, dict):
            raise BundleError(f"{MANIFEST}: run {run_id!r} lists no files")
        for rel, entry in files.items():
            parts = PurePosixPath(rel).parts
            if (not parts or rel.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
                    or not isinstance(entry, dict) or not isinstance(entry.get("size"), int)):
                raise BundleError(f"{MANIFEST}: {run_id}/{rel!s} is not a plain file of a run")
            total += entry["size"]
    if total > MAX_BYTES:
        raise BundleError(f"{MANIFEST}: unpacks to {total:,} bytes (allowed: at most {MAX_BYTES:,})")
    return manifest


def load_bundle(store: RunStore, path: Path) -> Loaded:
    """Load a bundle's runs that the store lacks (each verified, then renamed in whole). BundleError for a
    file that is not a bundle or a run whose files do not match the manifest (nothing of that run written)."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BundleError(f"{path}: not a readable zip file ({exc})") from None
    loaded, present = [], []
    with zf:
        manifest = read_manifest(zf)
        for run_id, files in manifest["runs"].items():
            try:
                final = store.path(run_id)
            except RunIdError as exc:
                raise BundleError(f"{MANIFEST}: {exc}") from None
            if final.exists():
                present.append(run_id)
                continue
            data = {}
            for rel, entry in files.items():
                try:
                    blob = zf.read(f"{run_id}/{rel}")
                except KeyError:
                    raise BundleError(f"{path.name}: {run_id}/{rel} is missing") from None
                if file_entry(blob) != {"size": entry["size"], "sha256": entry.get("sha256")}:
                    raise BundleError(f"{path.name}: {run_id}/{rel} does not match its manifest")
                data[rel] = blob
            if "config.json" not in data or "status.json" not in data:
                raise BundleError(f"{path.name}: run {run_id} has no config.json or status.json")
            _place(store, run_id, data, path.name)
            loaded.append(run_id)
    return Loaded(tuple(loaded), tuple(present), str(manifest.get("code_version") or ""))


def _place(store: RunStore, run_id: str, files: dict[str, bytes], bundle: str) -> None:
    """Write one run into a temp folder of the store (its status: nobody's, from `bundle`), then rename it in."""
    try:
        status = json.loads(files["status.json"])
    except ValueError:
        raise BundleError(f"{bundle}: {run_id}/status.json is not JSON") from None
    if not isinstance(status, dict) or status.get("state") not in FINISHED_STATES:
        raise BundleError(f"{bundle}: run {run_id} has not finished")
    status = {k: v for k, v in status.items() if k not in ("pid", "proc", "writer")}
    status.update(owner="", bundle=bundle)
    store.root.mkdir(parents=True, exist_ok=True)
    tag = temp_tag(store.root)
    tmp = Path(tempfile.mkdtemp(dir=store.root, prefix=f".{run_id}.{tag}.", suffix=".new"))
    try:
        for rel, blob in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(blob)
        _atomic_write(tmp / "status.json", _dumps(status), tag)
        os.rename(tmp, store.path(run_id))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_bundles(store: RunStore, paths: Sequence[Path]) -> list[str]:
    """Load every bundle of `paths` (LAB_BUNDLE's); one line per bundle saying what it did or why it could not."""
    lines = []
    for path in paths:
        try:
            got = load_bundle(store, path)
        except BundleError as exc:
            lines.append(f"Lesson bundle {path}: not loaded: {exc}")
            continue
        other = (f"; built with lab {got.code_version}, this server runs {code_version()}: its runs are shown "
                 "and labelled, and a click trains this version's own" if got.code_version != code_version() else "")
        lines.append(f"Lesson bundle {path.name}: {len(got.runs)} run(s) loaded, {len(got.present)} already here{other}")
    return lines
