"""What one poll of the Train tab's live view costs, kept small: a class of 30 students polls once a
second each, on the same two cores that train their runs.

- **Nothing recomputed that did not change.** The curve frames of a run are computed once per version
  of its metrics file (inode, size, modification time: it only grows by appends, and a continuation
  replaces it) and shared by every page that shows the run (`FrameCache`).
- **Nothing sent that the page already shows.** Each page (Gradio session) remembers what its last
  poll sent (`Seen`): a plot or text that has not changed since is answered with `gr.skip()`, so the
  page keeps what it shows. A run that has just ended is always sent in full (the last poll).
- **A slower refresh where nothing changes.** After `QUIET_POLLS` polls in a row that found nothing
  new (a run waiting in the queue at the same place), the timer ticks every `SLOW_S` seconds; the
  first change brings it back to `FAST_S`.
The event is unqueued (`queue=False` in ui/train.py): one HTTP request per refresh, never refused
by a full queue.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pandas as pd
from matplotlib.figure import Figure

from lab.views.analysis import sampled_probe
from lab.views.curves import thin
from lab.views.plots import KIND_TITLES, attention_grid, to_png
from lab.engine.sharing import provenance
from lab.records import CROSS, DEC_SELF, EXACT_MATCH, PREDICTABLE_ACC, TOKEN_ACC, Metric
from lab.tasks.batches import get_task
from lab.tasks.shapes import headline_metrics
from lab.teach.loss_reading import headline_sentence, overfitting_sentence
from lab.views.curves import SERIES_COLOURS, curve, with_series
from ui.common import AppContext

FAST_S = 1.0  # the refresh while something changes: a running run's curves and step count
SLOW_S = 3.0  # the refresh after QUIET_POLLS polls in a row found nothing new
QUIET_POLLS = 2
CACHED_RUNS = 128  # runs whose frames are kept (a class shows at most a few runs each)

Frames = tuple[pd.DataFrame, pd.DataFrame]
Version = tuple[int, ...]


def version(ctx: AppContext, run_id: str) -> Version:
    """What identifies the current content of a run's metrics and config files: (inode, size, mtime in ns)
    of each, zeros for a file that is not there. One stat() per file, no read."""
    folder = ctx.store.path(run_id)
    out: list[int] = []
    for name in ("metrics.jsonl", "config.json"):  # the files RunStore.metrics and .config read
        try:
            st = os.stat(folder / name)
            out += [st.st_ino, st.st_size, st.st_mtime_ns]
        except OSError:
            out += [0, 0, 0]
    return tuple(out)


class FrameCache:
    """A run's live curve frames by the version of its files, shared by every page (thread-safe).
    `computed` counts the frames actually computed (tests check that an unchanged run is not re-read)."""

    def __init__(self, compute: Callable[[AppContext, str], Frames], size: int = CACHED_RUNS) -> None:
        self._compute, self._size = compute, size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Version, Frames]] = OrderedDict()
        self.computed = 0

    def get(self, ctx: AppContext, run_id: str) -> tuple[Version, Frames]:
        """(version, frames) for the run as its files are now. The version is taken before the files are
        read: frames a little newer than their version are recomputed at the next poll, never missed."""
        key = version(ctx, run_id)
        with self._lock:
            hit = self._entries.get(run_id)
            if hit is not None and hit[0] == key:
                self._entries.move_to_end(run_id)
                return hit
        frames = self._compute(ctx, run_id)  # outside the lock: pages showing other runs do not wait
        with self._lock:
            self.computed += 1
            self._entries[run_id] = (key, frames)
            self._entries.move_to_end(run_id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return key, frames

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._entries.pop(run_id, None)


@dataclass(frozen=True)
class Seen:
    """What a page's last poll sent: the run, its frames' version (None: no frames), the text, and how
    many polls in a row found nothing new. Kept in a gr.State as a dict (`as_dict`/`of`)."""

    run: Optional[str] = None
    version: Optional[Version] = None
    text: Optional[str] = None
    quiet: int = 0
    snapshot: Optional[int] = None  # the attention snapshot's step drawn (None: none)

    @classmethod
    def of(cls, value: Any) -> "Seen":
        if not isinstance(value, dict):
            return cls()
        ver = value.get("version")
        snap = value.get("snapshot")
        return cls(value.get("run"), tuple(ver) if isinstance(ver, (list, tuple)) else None, value.get("text"),
                   int(value.get("quiet") or 0), snap if isinstance(snap, int) else None)

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "version": list(self.version) if self.version else None, "text": self.text,
                "quiet": self.quiet, "snapshot": self.snapshot}


@dataclass(frozen=True)
class Answer:
    """One poll's answer: what to send (None in `send_*`: skip it), the timer's interval, what was seen."""

    send_text: bool
    send_frames: bool
    interval: float
    seen: Seen


def answer(seen: Seen, run_id: str, text: str, frames_version: Optional[Version], final: bool) -> Answer:
    """Decide what a poll sends, given what the page was last sent. `frames_version` is None when the run
    has no curves to draw yet (queued); `final`: the run has ended (everything is sent, once)."""
    same_run = seen.run == run_id
    new_frames = final or not same_run or seen.version != frames_version
    new_text = final or not same_run or seen.text != text
    quiet = 0 if (new_frames or new_text) else seen.quiet + 1
    interval = SLOW_S if quiet >= QUIET_POLLS else FAST_S
    return Answer(new_text, new_frames, interval, Seen(run_id, frames_version, text, quiet))


ACC_TITLE = "Accuracy: the task's headline measure (the sentence above says which)"
# the live plots' series, one colour each in both plots (the loss plot listed train first, the accuracy plot
# held-out first, so each plot's default palette gave train and held-out opposite colours)
LIVE_COLOURS = {"train": SERIES_COLOURS[0], "held-out": SERIES_COLOURS[1], "held-out, longer lengths": SERIES_COLOURS[2]}
ACC_COLUMNS: dict[Metric, str] = {EXACT_MATCH: "exact-match", PREDICTABLE_ACC: "accuracy (predictable positions)",
                                  TOKEN_ACC: "token accuracy"}  # record column -> the curves' name for it (lab/views/curves.py CURVES)


def accuracy_of(task: str) -> Metric:
    """The accuracy the live plot draws for `task`: its headline accuracy (lab.tasks.shapes.headline_metrics),
    token accuracy for a character model (each next character right)."""
    return next((c for c in headline_metrics(task) if c in ACC_COLUMNS), TOKEN_ACC)


def live_frames(ctx: AppContext, run_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Train tab's two live plots as long frames (step, value, series): the loss (this step's batch,
    lightly smoothed, and held out) and the task's headline accuracy on the held-out and training sets
    (and held out at longer lengths where the task has them)."""
    m = ctx.store.metrics(run_id)
    points = ctx.jobs.limits.max_live_points  # a long run's curves stay a fixed size in memory and on the wire
    m = pd.concat([thin(m[m["kind"] == kind], points) for kind in ("train", "eval")])
    name = ctx.store.config(run_id).task.name
    acc = ACC_COLUMNS[accuracy_of(name)]
    has_ood = get_task(name).has_ood and acc == "exact-match"
    acc_series = ("held-out", "train", "held-out, longer lengths") if has_ood else ("held-out", "train")
    # per-step train loss is noisy at batch 32-64: light smoothing, as Compare's default
    loss = pd.concat([curve(m, "train loss (batch)", smoothing=0.6).assign(series="train"),
                      curve(m, "held-out loss").assign(series="held-out")])
    accs = pd.concat([curve(m, f"held-out {acc}").assign(series="held-out"),
                      curve(m, f"train {acc}").assign(series="train"),
                      curve(m, "held-out exact-match (longer lengths)").assign(series="held-out, longer lengths")])
    loss, accs = loss.rename(columns={"x": "step"}), accs.rename(columns={"x": "step"})
    # every series from the first poll on: a plot never draws a series that was absent when it first drew
    return (with_series(loss, "series", ("train", "held-out"), "step"),
            with_series(accs[accs["series"].isin(acc_series)], "series", acc_series, "step"))


class ShownRuns:
    """The run each page shows, by Gradio session, as its "Run shown" changes say (bounded, thread-safe).
    The timer's poll is unqueued and the change's is queued, so a tick asked for the run shown before can
    finish after the change to the next: its answer (the previous run's progress, picture and a stopped timer)
    would be the page's last word. A tick takes a `ticket` before it reads; `stale` says whether a change to
    another run came in since. A caller that asks for any run in turn (the API) is never stale."""

    def __init__(self, size: int = 4096) -> None:
        self._runs: OrderedDict[str, tuple[int, Optional[str]]] = OrderedDict()  # session -> (changes, run)
        self._size, self._lock = size, threading.Lock()

    def show(self, session: Optional[str], run_id: Optional[str]) -> None:
        if session:
            with self._lock:
                changes = self._runs.get(session, (0, None))[0]
                self._runs[session] = (changes + 1, run_id)
                self._runs.move_to_end(session)
                while len(self._runs) > self._size:
                    self._runs.popitem(last=False)

    def ticket(self, session: Optional[str]) -> int:
        """How many changes the page had made when a tick began."""
        with self._lock:
            return self._runs.get(session, (0, None))[0] if session else 0

    def stale(self, session: Optional[str], run_id: Optional[str], ticket: int) -> bool:
        """Whether the page changed to another run than `run_id` after the tick took `ticket`."""
        with self._lock:
            changes, shown = self._runs.get(session, (0, None)) if session else (0, None)
            return changes != ticket and shown != run_id


class SnapshotPictures:
    """The Train tab's attention pictures as PNG files by (run, snapshot step), drawn once for every page that
    shows the run (a class of 30 watching one run costs one drawing and one encoding a snapshot, not 30); the
    `size` most recent are kept, in a folder of the server's temporary directory (thread-safe)."""

    def __init__(self, size: int = 64) -> None:
        import tempfile

        self._folder = Path(tempfile.mkdtemp(prefix="lab-live-attention-"))
        self._size, self._lock = size, threading.Lock()
        self._entries: OrderedDict[tuple[str, int], Optional[str]] = OrderedDict()
        self.drawn = 0  # pictures actually drawn (tests check that pages share them)

    def get(self, ctx: AppContext, run_id: str, step: int) -> Optional[str]:
        """The PNG's path, or None for a snapshot without attention (a recurrent run keeps weights only)."""
        key = (run_id, step)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        fig = live_attention(ctx, run_id, step)  # outside the lock: pages showing other runs do not wait
        path = None
        if fig is not None:
            path = str(self._folder / f"{run_id}-{step}.png")
            Path(path).write_bytes(to_png(fig))
        with self._lock:
            self.drawn += 1
            self._entries[key] = path
            while len(self._entries) > self._size:
                _, old = self._entries.popitem(last=False)
                if old:
                    Path(old).unlink(missing_ok=True)
        return path


def live_attention(ctx: AppContext, run_id: str, step: int) -> Optional[Figure]:
    """The run's attention at snapshot `step` on its sampled probe, as Inspect draws it: decoder self-attention
    (an encoder-decoder's cross-attention), a layer a row and a head a column; None for a snapshot without
    attention. Read from the snapshot the training wrote anyway: it costs the training nothing."""
    patterns = ctx.store.load_snapshot(run_id, step)
    kind = next((k for k in (DEC_SELF, CROSS, *patterns) if k in patterns), None)
    if kind is None:
        return None
    probe = sampled_probe(ctx.store.config(run_id))
    return attention_grid(patterns[kind], *probe.axes(kind), f"{KIND_TITLES[kind]} at step {step:,} (the latest "
                          "snapshot, on the sampled probe)")


def progress_text(ctx: AppContext, run_id: str) -> tuple[str, str]:
    """(state, the Train tab's line on the run): its place in the queue, its progress, or its result in the
    measures that mean something for its task (lab/teach/loss_reading.py)."""
    st = ctx.jobs.status(run_id)
    if st.state == "queued":
        place = f"place {st.queue_position} in the queue" if st.queue_position else "waiting for a free slot"
        return st.state, f"⏳ **Queued** ({place}). It starts when a running job finishes."
    if st.state == "running":
        rate = f"{st.steps_per_s:.0f} steps/s" if st.steps_per_s else "starting"
        eta = f" · {st.eta_s:.0f} s left" if st.eta_s is not None else ""
        loss = f" · batch loss {st.last_loss:.4f}" if st.last_loss is not None else ""
        pct = 100 * st.step / max(st.total_steps, 1)
        return st.state, f"🏃 **Running** step {st.step}/{st.total_steps} ({pct:.0f}%) · {rate}{eta}{loss}"
    summary = ctx.store.summary(run_id) or {}
    ev, ood = summary.get("eval") or {}, summary.get("ood") or {}
    res = ""
    if ev:
        task = ctx.store.config(run_id).task
        res = " " + headline_sentence(task, ev)
        if ood and EXACT_MATCH in headline_metrics(task.name) and ood.get(EXACT_MATCH) is not None:
            res += f" On longer inputs: exact-match {ood[EXACT_MATCH]:.0%}."
        m = ctx.store.metrics(run_id)
        res += " " + overfitting_sentence(task, m[m["kind"] == "eval"].to_dict("records")) if len(m) else ""
    wall = f" in {summary['wall_s']:.1f} s" if summary.get("wall_s") else ""
    if st.state == "failed":
        return st.state, f"❌ **Failed**: {st.error}"
    icon = {"completed": "✅", "stopped": "⏹️", "interrupted": "⚠️"}.get(st.state, "")
    origin = provenance(ctx.store.status(run_id))  # a lesson bundle's run, or another lab version's
    return st.state, (f"{icon} **{st.state.capitalize()}** after {st.step} steps{wall}.{res.rstrip()}"
                      + (f" *{origin}*" if origin else ""))
