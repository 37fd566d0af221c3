"""What a lesson bundle weighs: every preset's runs in one file (lab/engine/bundle.py), by kind of file.

    python benchmarks/bundle_size.py --build --write-results        # python -m lab bundle --all, then measure it
    python benchmarks/bundle_size.py --bundle lesson.zip            # measure a bundle already built

Reports the bundle's size on disk, its runs and presets, and what each kind of file holds (uncompressed and
compressed): the final weights, the attention snapshots (with their float16 weights), the metrics and the
small JSON files; and what the runs' checkpoints, which a bundle leaves out, would have added (measured in
the store it was built from, when --build made it). --build trains every preset once on this machine (about
an hour on 2 CPU cores; minutes on a GPU) with the store in a temporary folder unless --runs-dir is given.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from results import RESULTS, write_block

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- bundle_size:start -->", "<!-- bundle_size:end -->"


def kind(name: str) -> str:
    rel = name.split("/", 1)[-1]
    if rel.startswith("attention/"):
        return "attention snapshots (float16 weights)"
    if rel == "weights.safetensors":
        return "final weights (float32)"
    if rel == "metrics.jsonl":
        return "metrics"
    return "config, status, summary, manifest"


def measure(bundle: Path, runs_dir: Path | None = None) -> dict:
    kinds: dict[str, list[int]] = {}
    with zipfile.ZipFile(bundle) as zf:
        manifest = json.loads(zf.read("bundle.json"))
        for info in zf.infolist():
            k = kinds.setdefault(kind(info.filename), [0, 0])
            k[0] += info.file_size
            k[1] += info.compress_size
    left_out = 0
    if runs_dir is not None:
        left_out = sum((runs_dir / r / "checkpoint.safetensors").stat().st_size for r in manifest["runs"]
                       if (runs_dir / r / "checkpoint.safetensors").exists())
    return {"bytes": bundle.stat().st_size, "runs": len(manifest["runs"]), "presets": manifest.get("presets", []),
            "code_version": manifest.get("code_version"), "kinds": kinds, "checkpoints_left_out": left_out}


def table(r: dict) -> str:
    mib = 2**20
    lines = [f"{len(r['runs']) if isinstance(r['runs'], list) else r['runs']} runs of {len(r['presets'])} presets "
             f"(lab {r['code_version']}): **{r['bytes'] / mib:.1f} MiB** on disk.", "",
             "| what | uncompressed | in the bundle |", "|---|---|---|"]
    for name, (raw, packed) in sorted(r["kinds"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {name} | {raw / mib:.1f} MiB | {packed / mib:.1f} MiB |")
    if r["checkpoints_left_out"]:
        lines.append(f"| checkpoints (left out: weights and AdamW moments, only to continue training) | "
                     f"{r['checkpoints_left_out'] / mib:.1f} MiB | 0 |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, help="a bundle already built")
    p.add_argument("--build", action="store_true", help="build the all-presets bundle first (python -m lab bundle --all)")
    p.add_argument("--runs-dir", type=Path, help="the store it is built in (default: a temporary folder)")
    p.add_argument("--write-results", action="store_true", help=f"update the bundle section of {RESULTS.name}")
    args = p.parse_args(argv)
    if args.build == bool(args.bundle):
        p.error("give --bundle FILE or --build")
    with tempfile.TemporaryDirectory(prefix="lab-bundle-") as tmp:
        runs_dir = args.runs_dir or Path(tmp) / "runs"
        bundle, wall = args.bundle, None
        if args.build:
            bundle, t0 = Path(tmp) / "lesson.zip", time.monotonic()
            subprocess.run([sys.executable, "-m", "lab", "bundle", "--all", "--out", str(bundle), "--runs-dir",
                            str(runs_dir)], cwd=REPO, check=True)
            wall = time.monotonic() - t0
        result = measure(bundle, runs_dir if runs_dir.exists() else None)
    text = table(result) + (f"\n\nBuilt in {wall / 60:.0f} min here." if wall else "")
    print(text)
    if args.write_results:
        write_block(START, END, f"## A lesson bundle of every preset (`python benchmarks/bundle_size.py --build`)\n\n"
                    f"{time.strftime('%Y-%m-%d', time.gmtime())}. {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
