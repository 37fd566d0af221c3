"""Presets tab: known results from docs/SCIENCE.md, one click each (the runs live in lab/teach/presets/catalog.py).

Each preset shows its "predict before you click" question, its reference and how long its runs would
take if started now: the job manager's estimate from this server's measured speed and its queue
(lab/engine/estimate.py), refreshed when the tab is opened and while a preset trains. Its button
launches all its runs and opens Compare on them with the preset's curve; a timer follows them ("n of
m runs done") and, once all are done, shows the preset's explanation, built from the measured
summaries. The last launched preset is kept in the browser (gr.BrowserState), so reopening the page
finds its runs again.

Each card also keeps its preset's last result on this server, for every browser: the explanation of the
newest finished run of each of the preset's runs, found in the store by its exact config (`newest_runs`),
refreshed with the estimates and when the browser's own preset finishes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import gradio as gr

from lab.config import RunConfig
from lab.engine.estimate import Estimate
from lab.engine.identity import class_seed, code_version, fresh_seed, seeded
from lab.engine.sharing import class_runs, describe_claim, provenance
from lab.teach.presets.catalog import PRESETS, Preset
from lab.engine.store import FINISHED_STATES, LIVE_STATES  # a stopped run has its final evaluation
from lab.engine.storefs import DamagedRunError, RunIdError, RunNotFoundError
from lab.teach.presets.results import run_result, wanted
from lab.views.curve_figures import Mark
from ui.common import PRIVATE, AppContext, Outputs, errors_as_messages, kept, remember_runs
from ui.compare.tab import Opened
from ui.compare.tab import opening as compare_opening
from ui.projector import folded

POLL_S = 2.0
_RESULTS: dict[tuple, str] = {}  # (preset key, its newest finished runs with their updated_at) -> explanation
INTRO = ("Known results, reproduced on this machine in seconds to minutes. **Read the question and make a "
         "prediction first**, then click: the button starts every run of the preset and opens **Compare** on "
         "them. When they finish, a sentence here (and above Compare's curves) says what happened and why.")


def wall_text(est: Estimate) -> str:
    """The wait if the preset were started now, and where that figure comes from (one sentence)."""
    return f"⏱ {est.text()}"


def card(p: Preset, est: Estimate, result: str = "") -> str:
    n = len(p.runs)
    return (f"### {p.title}\n**Predict before you click:** {p.question}\n\n"
            f"*{p.reference}.* {n} run{'s' if n > 1 else ''}; opens Compare on *{' and '.join(p.metrics)}*.\n\n{wall_text(est)}"
            + (f"\n\n{result}" if result else ""))


def cards(ctx: AppContext, owner: Any = "", results: bool = True) -> list[str]:
    """Every preset's card with the estimate for this server now and, with `results`, its last result on
    this server (one store listing; explanations of unchanged runs are cached)."""
    who = owner if isinstance(owner, str) else ""
    found = newest_runs(ctx) if results else {}
    return [card(p, ctx.jobs.estimate(list(p.runs), owner=who), last_result(ctx, p, found.get(p.key, {})) if results
                 else "") for p in PRESETS.values()]


def newest_runs(ctx: AppContext) -> dict[str, dict[str, tuple[str, str]]]:
    """Preset key -> {run name: (run id, updated_at)}: for each run of each preset, the newest finished run
    on this server (any browser's; completed, or stopped with its final evaluation) whose config is exactly
    that run's, name included. Configs are read only for runs that bear a preset run's name."""
    listing = ctx.store.list()  # oldest first
    if listing.empty or "final.steps" not in listing:
        return {}
    wanted: dict[str, list[tuple[str, RunConfig]]] = {}
    for p in PRESETS.values():
        for cfg in p.runs:
            wanted.setdefault(cfg.name, []).append((p.key, cfg))
    done = listing[listing["state"].isin(FINISHED_STATES) & listing["name"].isin(list(wanted)) & listing["final.steps"].notna()]
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for run_id, name, updated in reversed(list(done[["run_id", "name", "updated_at"]].itertuples(index=False))):
        todo = [(key, cfg) for key, cfg in wanted[name] if name not in out.get(key, {})]
        if not todo:
            continue
        try:
            cfg = ctx.store.config(run_id)
        except (RunNotFoundError, DamagedRunError):
            continue
        for key, want in todo:
            if cfg == want:
                out.setdefault(key, {})[name] = (run_id, str(updated))
    return out


def last_result(ctx: AppContext, preset: Preset, runs: dict[str, tuple[str, str]]) -> str:
    """The card's sentence on the preset's last result here: its explanation from the runs `newest_runs`
    found (kept while none of them changes), or that it has not been run on this server."""
    if not runs:
        return "*Not run on this server yet: its result appears here once its runs have finished.*"
    key = (preset.key, *sorted(runs.items()))
    if key not in _RESULTS:
        results: dict[str, dict] = {}
        for name, (run_id, _) in runs.items():
            try:
                summary = ctx.store.summary(run_id)
                if summary:
                    results[name] = run_result(ctx.store, run_id, summary, wanted(preset, name))
            except (RunNotFoundError, DamagedRunError):
                continue
        _RESULTS[key] = preset.explain(results)
        while len(_RESULTS) > 64:
            _RESULTS.pop(next(iter(_RESULTS)))
    when = max(updated for _, updated in runs.values())[:16].replace("T", " ")
    origins = set()
    for run_id, _ in runs.values():
        try:
            origins.add(provenance(ctx.store.status(run_id)))
        except (RunNotFoundError, DamagedRunError):
            continue
    origin = " ".join(o.rstrip(".") for o in sorted(origins) if o)  # before the explanation: it may end in a table
    return f"**Last result on this server** (finished by {when} UTC{f'; *{origin}*' if origin else ''}): {folded(_RESULTS[key])}"


def last_runs(ctx: AppContext, last: Any) -> tuple[Preset | None, list[str]]:
    """The browser's stored {"key", "run_ids"}, checked: (preset or None, its run ids that still exist)."""
    if not isinstance(last, dict) or last.get("key") not in PRESETS:
        return None, []
    ids = last.get("run_ids")
    ids = [r for r in (ids if isinstance(ids, list) else [])[:64] if isinstance(r, str)]
    out = []
    for r in ids:
        try:
            if ctx.store.exists(r):
                out.append(r)
        except RunIdError:
            continue
    return PRESETS[last["key"]], out


def status(ctx: AppContext, last: Any) -> tuple[str, bool]:
    """(progress or explanation text, whether any run is still queued or running)."""
    text, live, _ = said(ctx, last)
    return text, live


def said(ctx: AppContext, last: Any) -> tuple[str, bool, tuple[Mark, ...]]:
    """`status`, and the steps its explanation quotes (to mark on the curves; none while a run trains)."""
    preset, ids = last_runs(ctx, last)
    if preset is None:
        return "", False, ()
    expected = len(preset.runs)
    if not ids:
        return f"**{preset.title}**: its runs are gone (deleted?). Click the preset to run it again.", False, ()
    results: dict[str, dict] = {}
    live = done = 0
    for r in ids:
        try:
            state = ctx.store.status(r).get("state")
            name = ctx.store.config(r).name
            summary = ctx.store.summary(r)
        except (RunNotFoundError, DamagedRunError):
            continue
        if state in LIVE_STATES:
            live += 1
        else:
            done += 1
            if summary:
                results[name] = run_result(ctx.store, r, summary, wanted(preset, name))
    note = last.get("note") if isinstance(last.get("note"), str) else ""
    head = (f"🔁 {note[:400]}\n\n" if note else "") + f"**{preset.title}**: {done} of {expected} runs done"
    if live:
        return head + " (training…). The explanation appears here when all have finished.", True, ()
    return f"{head}. {folded(preset.explain(results))}", False, preset.marks(results)


def compare_note(ctx: AppContext, last: Any, run_ids: list[str]) -> str:
    """Compare's note above the curves (`compare_said`'s text)."""
    return compare_said(ctx, last, run_ids)[0]


def compare_said(ctx: AppContext, last: Any, run_ids: list[str]) -> tuple[str, tuple[Mark, ...]]:
    """Compare's note above the curves, and the steps to mark on them: the last preset's progress or
    explanation and the steps it quotes while exactly its runs are picked (with "my own seed", its runs and the
    class's), else nothing (its sentence and marks never stand on other runs' curves)."""
    _, ids = last_runs(ctx, last)
    pooled = isinstance(last, dict) and last.get("class") is True
    other = other_versions(ctx, run_ids)
    if not ids or not (set(ids) == set(run_ids) or pooled and set(ids) <= set(run_ids)):
        return other, ()
    text, _, marks = said(ctx, last)
    return text + (f"\n\n{other}" if other else ""), marks


def other_versions(ctx: AppContext, run_ids: list[str]) -> str:
    """A line under Compare's note when some shown runs were trained by another version of the lab (a lesson
    bundle built with it, or an older store): their curves are that version's, not this server's."""
    versions: dict[str, int] = {}
    for run_id in run_ids:
        try:
            version = ctx.store.status(run_id).get("code_version")
        except (RunIdError, RunNotFoundError, DamagedRunError):
            continue
        if isinstance(version, str) and version and version != code_version():
            versions[version] = versions.get(version, 0) + 1
    if not versions:
        return ""
    which = ", ".join(f"{n} by lab {v}" for v, n in sorted(versions.items()))
    return (f"*{sum(versions.values())} of the {len(run_ids)} runs shown were trained by another version of the lab "
            f"({which}; this server runs {code_version()}).*")


def shown_runs(ctx: AppContext, preset: Preset, ids: list[str], pooled: bool) -> list[str]:
    """The runs Compare opens on: the preset's, and with "my own seed" every class run of its configurations
    (one band per configuration: the class's band)."""
    if not pooled:
        return ids
    mine = [ctx.store.config(r) for r in ids]
    return ids + [r for r in class_runs(ctx.store, mine) if r not in ids]


@dataclass(frozen=True)
class PresetLaunch(Outputs):
    """A preset button's outputs: the browser's last preset and runs, the preset's line and timer, Compare
    opened on its runs (ui/compare/tab.py `Opened`'s fields, in its order, after these: an API client reads
    them by position)."""
    last: Any = kept()
    my_runs: Any = kept()
    status: Any = kept()
    timer: Any = kept()
    tabs: Any = kept()
    asked: Any = kept()


@errors_as_messages
def run_preset(ctx: AppContext, preset: Preset, runs: Any, who: Any, own: Any = False) -> tuple:
    """Ask for every run of `preset` (the runs already on this server for the same configurations, else new
    ones: lab/engine/sharing.py), remember them, and open Compare on them with the preset's curve. With `own`
    ("My own seed") they train the student's own seed and Compare pools the class's runs."""
    owner = who if isinstance(who, str) else ""
    seed = class_seed(owner) if own is True else None
    return launch(ctx, preset, runs, owner, seed, "class" if own is True else "")


@errors_as_messages
def run_again(ctx: AppContext, last: Any, runs: Any, who: Any) -> tuple:
    """"Train again with a new seed": the last preset's runs, each with one new random seed."""
    preset, _ = last_runs(ctx, last)
    if preset is None:
        raise gr.Error("No preset has been run from this browser yet: click a preset first.")
    return launch(ctx, preset, runs, who if isinstance(who, str) else "", fresh_seed())


def launch(ctx: AppContext, preset: Preset, runs: Any, owner: str, seed: int | None, seed_from: str = "") -> tuple:
    """Claim the preset's runs, and open Compare on them."""
    cfgs = [c if seed is None else seeded(c, seed) for c in preset.runs]
    claims = ctx.jobs.claim_many(cfgs, owner=owner, seed_from=seed_from)
    ids = [c.run_id for c in claims]
    attached = [c for c in claims if c.attached]
    last = {"key": preset.key, "run_ids": ids, **({"class": True} if seed_from == "class" else {}),
            **({"note": describe_claim(attached[0]) + (" For runs of your own, click 🎲 *Train the last preset again "
                                                       "with a new seed* on the Presets tab.")} if attached else {})}
    text, live = status(ctx, last)
    shown = shown_runs(ctx, preset, ids, seed_from == "class")
    return PresetLaunch(last=last, my_runs=remember_runs(runs, ids), status=text, timer=gr.Timer(active=live),
                        **compare_opening(shown, preset.metrics)).values()


@errors_as_messages
def preset_progress(ctx: AppContext, last: Any) -> tuple:
    """(the last preset's progress or explanation, its timer: on while any of its runs is live)."""
    text, live = status(ctx, last)
    return text, gr.Timer(active=live)


def preset_restored(ctx: AppContext, stored: Any) -> tuple:
    """The page's load event: the last preset's line and timer, as `preset_progress` gives them."""
    return preset_progress(ctx, stored)


@errors_as_messages
def show_preset(ctx: AppContext, last: Any) -> tuple:
    """Compare opened on the last preset's runs (an error when this browser has none)."""
    preset, ids = last_runs(ctx, last)
    if preset is None or not ids:
        raise gr.Error("No preset has been run from this browser yet (or its runs were deleted).")
    shown = shown_runs(ctx, preset, ids, isinstance(last, dict) and last.get("class") is True)
    return Opened(**compare_opening(shown, preset.metrics)).values()


@errors_as_messages
def preset_cards(ctx: AppContext, who: Any) -> list[str]:
    """Every card's text (one per preset, in PRESETS order: the cards' order on the tab)."""
    return cards(ctx, who)


@dataclass
class PresetsTab:
    last: gr.BrowserState
    status: gr.Markdown
    timer: gr.Timer
    buttons: dict[str, gr.Button]
    show: gr.Button
    again: gr.Button
    own_seed: gr.Checkbox
    on_load: Callable
    ctx: AppContext
    tab: gr.Tab
    cards: list[gr.Markdown]

    def wire(self, tabs: gr.Tabs, compare: Any, my_runs: gr.BrowserState, owner: gr.BrowserState) -> None:
        """Register the buttons once Compare exists. On page load, `demo.load(self.on_load, inputs=self.last,
        outputs=[self.status, self.timer])` restores the last preset's progress or explanation (Compare's note
        follows its own selection: compare_note)."""
        ctx, opens = self.ctx, compare.opener(tabs)
        outputs = PresetLaunch.wired(self, my_runs=my_runs, **opens)
        for key, button in self.buttons.items():
            button.click(partial(run_preset, ctx, PRESETS[key]), inputs=[my_runs, owner, self.own_seed],
                         outputs=outputs, api_name=f"preset_{key}")
        self.again.click(partial(run_again, ctx), inputs=[self.last, my_runs, owner], outputs=outputs,
                         api_name="preset_again")
        self.timer.tick(partial(preset_progress, ctx), inputs=self.last, outputs=[self.status, self.timer],
                        api_name="preset_poll", show_progress="hidden",
                        api_visibility=PRIVATE)
        self.show.click(partial(show_preset, ctx), inputs=[self.last], outputs=Opened.wired(**opens),
                        api_name="preset_show", api_visibility=PRIVATE)
        # the cards' estimates and last results follow the server: when the tab is opened, while a preset
        # trains, and once more when this browser's preset line changes (its last run finished: a tick's
        # card refresh may have read the store just before)
        on_cards = partial(preset_cards, ctx)
        self.tab.select(on_cards, inputs=owner, outputs=self.cards, api_name="preset_cards", show_progress="hidden")
        self.timer.tick(on_cards, inputs=owner, outputs=self.cards, api_name="preset_cards_poll",
                        show_progress="hidden", api_visibility=PRIVATE)
        self.status.change(on_cards, inputs=owner, outputs=self.cards, api_name="preset_cards_done",
                           show_progress="hidden", api_visibility=PRIVATE)


def build_presets_tab(ctx: AppContext, last: gr.BrowserState) -> PresetsTab:
    """`last`: gr.BrowserState({}, storage_key="lab-last-preset"), made outside gr.Tabs (a direct child of
    gr.Tabs is taken for a tab and the headers show wrong labels; inside a tab not yet shown, its stored
    value is not read at page load)."""
    with gr.Tab("Presets", id="presets") as tab:
        gr.Markdown(INTRO)
        with gr.Row():
            status_md = gr.Markdown("", elem_id="preset-status")
            show = gr.Button("Show the last preset in Compare", size="sm", scale=0, elem_id="preset-show")
            again = gr.Button("🎲 Train the last preset again with a new seed", size="sm", scale=0,
                              elem_id="preset-again")
        own_seed = gr.Checkbox(False, label="My own seed", elem_id="preset-own-seed",
                               info="Each student trains a seed of their own: Compare draws the class's runs of each "
                                    "configuration as one band. Off: everyone who clicks a preset watches the same "
                                    "runs, trained once on this server.")
        buttons, card_mds = {}, []
        for p, text in zip(PRESETS.values(), cards(ctx, results=False)):  # results: when the tab is opened
            with gr.Group():
                card_mds.append(gr.Markdown(text, elem_id=f"preset-card-{p.key}", padding=True))
                buttons[p.key] = gr.Button(f"Run “{p.title}”", variant="primary", size="sm",
                                           elem_id=f"preset-{p.key}")
        timer = gr.Timer(POLL_S, active=False)
    return PresetsTab(last, status_md, timer, buttons, show, again, own_seed, partial(preset_restored, ctx), ctx, tab,
                      card_mds)
