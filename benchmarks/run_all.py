"""Every performance figure of the lab in one command: prints a table, writes benchmarks/RESULTS.md.

    python benchmarks/run_all.py            # every figure, writes RESULTS.md
    python benchmarks/run_all.py --quick    # shorter timings and caps, for a smoke test
    python benchmarks/run_all.py --only throughput,batched

Sections: throughput against the hand-written baseline (S/M/L x every PE, benchmarks/throughput.py)
with the fraction of the measured fp32 matmul peak; time to solve each preset; 1, 2 and 4 runs at
once (process and thread workers); batched seeds against sequential ones; training in the running
app against the CLI; app cold start against `import gradio, torch`; Compare with 200 runs; Inspect.
Ratios are measured within one run (the machine is shared and noisy). RESULTS.md keeps other
sections: only the text between the run_all markers is replaced.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the repo (lab, ui, app) and this folder

import torch  # noqa: E402

import throughput  # noqa: E402
import training_bench as tb  # noqa: E402
from lab.config import POS_ENCODINGS  # noqa: E402
from results import RESULTS, write_block  # noqa: E402

START, END = "<!-- run_all:start -->", "<!-- run_all:end -->"
SECTIONS = ("throughput", "presets", "concurrency", "batched", "app_vs_cli", "cold_start", "compare", "inspect")


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE.parent,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" (+ uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def run_throughput(quick: bool) -> list[str]:
    throughput.MODEL_S = 1.5 if quick else 3.0
    peak = tb.matmul_peak_gflops(1)
    args = SimpleNamespace(steps=0, repeats=0, control=True)
    torch.set_num_threads(1)
    rows = []
    for name in throughput.CONFIGS:
        rows += throughput.bench_config(name, list(POS_ENCODINGS), args, torch.device("cpu"))
        peak = max(peak, tb.matmul_peak_gflops(1))  # between configs too: the least disturbed wins
    lines = [f"fp32 matmul peak, 1 thread (best 512^3 GEMM of 160, between the configs): **{peak:.1f} GFLOP/s**", "",
             "| config | PE | ours tok/s | baseline tok/s | ratio (q25-q75) | vs learned PE | ours GFLOP/s | of peak |",
             "|---|---|---|---|---|---|---|---|"]
    learned = {r["config"]: r["ratio"] for r in rows if r["pe"] == "learned"}
    for r in rows:
        name = r["config"]
        vs = f"{r['ratio'] / learned[name]:.2f}" if name in learned else ""
        lines.append(f"| {name} | {r['pe']} | {r['ours_tok_s']:,.0f} | {r['base_tok_s']:,.0f} | {r['ratio']:.3f} "
                     f"({r['ratio_q25']:.2f}-{r['ratio_q75']:.2f}) | {vs} | {r['ours_gflop_s']:.1f} | "
                     f"{r['ours_gflop_s'] / peak:.0%} |")
    return lines + ["", "ratio = baseline step time / ours, paired per round; the `(baseline)` row is a second "
                    "baseline timed as ours: its distance from 1 is this run's noise. vs learned PE = this PE's "
                    "ratio / the learned PE's ratio (both against the same baseline): its speed relative to "
                    "learned. 1 thread."]


def run_presets(quick: bool) -> list[str]:
    lines = ["| preset | headline run | target | solved | best value | at step (of) | wall s |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    with tb.sort_before_recipe():
        rows.append(("hello_sort (before)", tb.time_to_solve("hello_sort", cap_scale=0.5 if quick else 1.0)))
    rows += [(key, tb.time_to_solve(key, cap_scale=0.5 if quick else 1.0)) for key in tb.TARGETS]
    for name, r in rows:
        cap = " (time cap)" if r["capped"] else ""
        lines.append(f"| {name} | {r['run']} | {r['target']} | {'yes' if r['solved'] else 'no' + cap} | "
                     f"{r['best']:.3f} | {r['step']} ({r['of_steps']}) | {r['wall_s']:.1f} |")
    before, after = rows[0][1], rows[1][1]
    return lines + ["", f"hello_sort after / before, paired in this run: {after['wall_s'] / before['wall_s']:.2f}x "
                    f"the seconds, {after['step'] / before['step']:.2f}x the steps. `(before)`: the sort task's "
                    "sampling and the preset's steps before the recipe was mended (benchmarks/training_bench.py "
                    "sort_before_recipe). The change reaches no other preset (the sampling differs only below 6 symbols; "
                    "the other presets sort 10 symbols or run other tasks), so their steps to target are what they "
                    "were, at their fixed seeds.", "",
                    "Training-loop seconds until the first evaluation that meets the target (1 thread, CPU). "
                    "Only each preset's headline run is timed, stopped at its target, with a time cap of "
                    "60 s (100 s for grokking); the presets' full costs are in lab/teach/presets/catalog.py."]


def run_concurrency(quick: bool) -> list[str]:
    lines = ["| workers | job slots | runs at once | aggregate tok/s (end to end) | vs 1 | in training loops | vs 1 |",
             "|---|---|---|---|---|---|---|"]
    steps = 150 if quick else 300
    rows = tb.concurrent_runs(modes=("process",), steps=steps, rounds=1 if quick else 2)
    rows += tb.concurrent_runs(modes=("process",), counts=(1, 4), steps=steps, rounds=1, slots=4)
    rows += tb.concurrent_runs(modes=("thread",), counts=(1, 2), steps=steps, rounds=1)
    for r in rows:
        lines.append(f"| {r['mode']} | {r['slots']} | {r['runs']} | {r['e2e_tok_s']:,.0f} | {r['e2e_x']:.2f}x | "
                     f"{r['loop_tok_s']:,.0f} | {r['loop_x']:.2f}x |")
    return lines + ["", "The app's default run (reverse, d 64, 2 layers, batch 64), one intra-op thread per run. Job "
                    "slots: the app's default (one per core; more runs wait in the queue), and 4 slots on purpose "
                    "(4 processes on 2 cores: oversubscribed). End to end: submit to the last finish (process "
                    "start, eval, saving included); in training loops: tokens / (training-loop seconds summed over "
                    "runs / runs training at a time). A slot's worker process trains job after job, so a queued "
                    "run starts without importing torch again. Process workers (the default) with the default "
                    "slots: counts interleaved, best of 2 rounds; the others 1 round."]


def run_batched(quick: bool) -> list[str]:
    rows = [tb.batched_vs_sequential(k=4, steps=60 if quick else 150)]
    lines = ["| seeds | model | steps | sequential s | batched s | ratio |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | d {r['d_model']} | {r['steps']} | {r['sequential_s']:.2f} | {r['batched_s']:.2f} | "
                     f"{r['ratio']:.2f}x |")
    return lines + ["", "ratio = time of k solo trainings / one batched training of the k seeds (lab/batched.py), "
                    "1 thread, CPU; > 1 means batching wins."]


def run_app_vs_cli(quick: bool) -> list[str]:
    import app_bench

    lines = ["| app jobs run in | app tok/s | CLI tok/s | slowdown (CLI / app) | status polls |", "|---|---|---|---|---|"]
    for r in app_bench.app_vs_cli(steps=500 if quick else 1000, rounds=1 if quick else 2):
        lines.append(f"| {r['mode']} | {r['app_tok_s']:,.0f} | {r['cli_tok_s']:,.0f} | {r['slowdown']:.3f} | {r['polls']} |")
    return lines + ["", "The same run (default config, 1 thread) by `python -m lab train --threads 1` and started "
                    "through a served app's /start endpoint (its own job manager, a worker process), polled with "
                    "/poll once a second; tok/s of the training loop, best of 2 alternating rounds."]


def run_cold_start(quick: bool) -> list[str]:
    import app_bench

    r = app_bench.cold_start(rounds=1 if quick else 2)
    return [f"`python app.py` to a page that answers: **{r['app_s']:.1f} s**; `python -c \"import gradio, torch\"`: "
            f"**{r['import_s']:.1f} s**; ratio **{r['ratio']:.2f}x** (fastest of the rounds, interleaved)."]


def run_compare(quick: bool) -> list[str]:
    import app_bench

    r = app_bench.compare_200()
    return [f"200 stored runs picked at once ({r['curve_points']:,} curve points): Compare's one render event (listing "
            "table, overlaid curves, final metrics, config diff, parameter chart, seed groups, stability map) ready "
            f"in **{r['first_s']:.2f} s** (again, for a fresh page: {r['again_s']:.2f} s)."]


def run_inspect(quick: bool) -> list[str]:
    import app_bench

    r = app_bench.inspect_run()
    return [f"Stored run: attention heatmap grid **{r['heatmaps_s']:.2f} s**, PE PCA panel **{r['pca_s']:.2f} s** "
            f"(total {r['total_s']:.2f} s)."]


RUNNERS: dict[str, Callable[[bool], list[str]]] = {
    "throughput": run_throughput, "presets": run_presets, "concurrency": run_concurrency, "batched": run_batched,
    "app_vs_cli": run_app_vs_cli, "cold_start": run_cold_start, "compare": run_compare, "inspect": run_inspect,
}
TITLES = {"throughput": "Training throughput against the baseline (CPU)", "presets": "Time to solve the presets",
          "concurrency": "Runs at once", "batched": "Batched seeds against sequential",
          "app_vs_cli": "Training inside the app against the CLI", "cold_start": "App cold start",
          "compare": "Compare with 200 runs", "inspect": "Inspect a stored run"}


def write_results(body: str, path: Path = RESULTS) -> None:
    """Replace this benchmark's block of RESULTS.md (appended if it has none); other blocks stay."""
    write_block(START, END, body, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter timings and caps (a smoke test)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    for s in only:
        if s not in RUNNERS:
            ap.error(f"--only: {s!r} is not one of {', '.join(SECTIONS)}")
    t0 = time.perf_counter()
    device = "CUDA " + torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU only (no GPU here)"
    head = [f"## run_all.py ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
            f"- machine: {_machine()}; load average at start {os.getloadavg()[0]:.1f} (shared with other jobs: "
            f"absolute numbers are noisy, ratios are paired within this run)",
            f"- commit: {_commit()}; torch {torch.__version__}; python {platform.python_version()}; device: {device}",
            f"- mode: {'quick' if args.quick else 'full'}"]
    parts = ["\n".join(head)]
    print(parts[0] + "\n", flush=True)
    for name in only:
        s0 = time.perf_counter()
        try:
            lines = RUNNERS[name](args.quick)
        except Exception:
            lines = ["FAILED:", "```", traceback.format_exc(limit=4).rstrip(), "```"]
        section = f"### {TITLES[name]}\n\n" + "\n".join(lines) + f"\n\n({time.perf_counter() - s0:.0f} s)"
        print(section + "\n", flush=True)
        parts.append(section)
    parts.append(f"Total {time.perf_counter() - t0:.0f} s, load average at the end {os.getloadavg()[0]:.1f}.")
    print(parts[-1])
    if not args.no_write:
        write_results("\n\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
