"""What each part of Inspect's intervention panel shows (ui/inspect/interventions.py lays them out and wires them): the
model's answer, the held-out metrics, answer and attention under interventions, the head importance grid
(maps cached per run in memory), the logit lens, free generation, and the intervention controls built for a
run. Each part is a dict of output name -> value, so the page event sends only what changes; `api_call`
gives the API's endpoints the same parts, with everything explicit. All of it uses the run's final weights.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

import gradio as gr

from lab.config import RECURRENT, ConfigError, RunConfig
from lab.engine.storefs import RunNotFoundError
from lab.interventions import MODES, Interventions, applied, parse_heads, parse_layers
from lab.interventions import POSITIONAL as INTERVENED_POSITIONAL
from lab.model import Transformer
from lab.views.analysis import (MAX_PROBE_CHARS, PROBE_SOURCES, ProbeInput, attention, generation_prompt, load_model, parse_probe, sampled_probe,
                                tokens_text)
from lab.views.plots import KIND_TITLES, attention_grid
from lab.views.probe_plots import (answer_frame, answer_summary, importance_frame, importance_sentence,
                                   lens_figure, metrics_frame, styled_answer)
from lab.views.probing import (ablation_report, generate, greedy_answer, importance_map, logit_lens, means_for,
                               measured_on)
from lab.records import CROSS, DEC_SELF, ENC_SELF
from ui.common import AppContext

KINDS = tuple(KIND_TITLES)  # the attention kinds, in the order their figures stand
POSITIONAL_INFO = "what the model is told of token order: its positional encoding as trained, removed or shuffled"
POSITIONAL = list(zip(("intact", "removed", "shuffled"), INTERVENED_POSITIONAL))  # (label, value)
MAX_TEXT = MAX_PROBE_CHARS  # characters of a typed input or prompt
MAX_MAPS = 16  # importance maps kept in memory (one per run, final step and knockout mode)
LENS_NOTE = ("**Weights at step {step}.** What the model would predict if the stack stopped after each layer: the "
             "decoder's residual stream through the final norm and the head, for the probe input above.")
SEE_NOTE = "Nothing to answer: see the note beside **Typed input**."
NO_ATTENTION = ("This is a recurrent run ({arch}): it reads one token at a time and has no attention, heads or "
                "positional encoding to draw. Its answer, held-out metrics and skipped layers still apply.")



class MapCache:
    """Importance maps by (run id, final step, knockout mode); the MAX_MAPS most recently used are kept."""

    def __init__(self, size: int = MAX_MAPS) -> None:
        self._maps: OrderedDict[tuple, list] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, key: tuple) -> Optional[list]:
        with self._lock:
            if key in self._maps:
                self._maps.move_to_end(key)
            return self._maps.get(key)

    def put(self, key: tuple, maps: list) -> None:
        with self._lock:
            self._maps[key] = maps
            self._maps.move_to_end(key)
            while len(self._maps) > self.size:
                self._maps.popitem(last=False)


def final_model(ctx: AppContext, run_id: Any, step: Any = None) -> tuple[RunConfig, Transformer, int]:
    """(config, a fresh model, the step its weights are from): the weights kept with the attention snapshot
    nearest `step` (the one the heatmaps draw) where there are some, else the run's final weights."""
    ctx.store.path(run_id)  # RunIdError: not a run id (no path tricks)
    summary = ctx.store.summary(run_id)
    if summary is None:
        raise ConfigError("Run", "this run has no final weights yet: wait until it finishes")
    cfg = ctx.store.config(run_id)
    final = int(summary.get("steps") or 0)
    at = ctx.store.snapshot_near(run_id, step) if isinstance(step, (int, float)) and step == step else None
    if at is not None and at != final:  # the snapshot the heatmaps draw for the same slider value
        try:
            weights, at = ctx.store.weights_at(run_id, at)
            return cfg, load_model(cfg, weights), at
        except (RunNotFoundError, ValueError):
            pass  # no snapshot there, or one without weights: the final weights
    return cfg, load_model(cfg, ctx.store.load_weights(run_id)), final


def probe_input(cfg: RunConfig, source: Any, text: Any) -> ProbeInput:
    if source not in PROBE_SOURCES:
        raise ConfigError("Probe input", f"{source!r} is not one of {', '.join(PROBE_SOURCES)}")
    if source == "sampled":
        return sampled_probe(cfg)
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ConfigError("Typed input", f"must be text of at most {MAX_TEXT} characters")
    try:
        return parse_probe(cfg, text)
    except ConfigError as exc:
        raise ConfigError("Typed input", str(exc).split(": ", 1)[-1]) from None


def _names(value: Any, label: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise ConfigError(label, "must be a list of names such as 1.0 (a head) or 0 (a layer)")


def spec_from(heads: Any, mode: Any, skip_ff: Any, skip_block: Any, positional: Any) -> Interventions:
    """The controls' values as an Interventions (ConfigError naming the control's label)."""
    return Interventions(heads=parse_heads(_names(heads, "Heads")), mode=mode or "zero",
                         skip_ff=parse_layers(_names(skip_ff, "Skip feed-forward"), "Skip feed-forward"),
                         skip_block=parse_layers(_names(skip_block, "Skip block"), "Skip block"),
                         positional=positional or "intact")


# ---- the parts of the panel, by output name --------------------------------------------------------
def table(value: Any = None, **kw: Any) -> gr.Dataframe:
    return gr.Dataframe(value=value, visible=value is not None, **kw)


def answer_parts(cfg: RunConfig, model: Transformer, probe: ProbeInput, name: str = "answer") -> dict[str, Any]:
    """The answer table and its one-line summary (`name` and `name`_note) of `model` as it is now."""
    answer = greedy_answer(model, cfg, probe.batch)
    mark = "✓" if answer.exact else "✗"
    how = " (greedy, token by token)" if answer.greedy else ""
    who = "With interventions" if name == "ablated" else "Intact model"
    return {name: table(styled_answer(answer_frame(answer, probe.dec_labels))),
            f"{name}_note": f"**{who}: {mark} {answer_summary(answer)}**{how}"}


def _plots(patterns: Optional[dict], probe: Optional[ProbeInput],
           spec: Optional[Interventions] = None) -> dict[str, gr.Plot]:
    """The probe's attention with `spec` applied; heads whose output it removes are hatched."""
    if patterns is None:
        return {f"attn_{k}": gr.Plot(None, visible=False) for k in KINDS}
    spec = spec or Interventions()

    def grid(k: str) -> Any:
        silenced = spec.silenced(k, patterns[k].shape[1])
        title = KIND_TITLES[k] + ", with interventions" + ("\n(hatched: output removed)" if silenced else "")
        return attention_grid(patterns[k], *probe.axes(k), title, silenced)
    return {f"attn_{k}": gr.Plot(grid(k), visible=True) if k in patterns else gr.Plot(None, visible=False)
            for k in KINDS}


def ablated_parts(cfg: RunConfig, model: Transformer, spec: Interventions, probe: Optional[ProbeInput],
                  step: Optional[int] = None) -> dict:
    """Held-out metrics intact vs with `spec` (on what, said in the note: `step` is the weights'), and the
    probe's answer and attention with it."""
    means = means_for(model, cfg, spec)  # once, for the held-out metrics and the probe
    report = ablation_report(model, cfg, spec, means=means)
    done = "; ".join(report["interventions"]) or "none chosen (both columns are the intact model)"
    out = {"metrics": table(metrics_frame(report), label=f"Held-out metrics on {measured_on(report['n'], step)}"),
           "applied_note": f"Interventions applied: {done}."}
    if probe is None:
        return out | cleared_ablated(SEE_NOTE)
    with applied(model, spec, means):
        out |= answer_parts(cfg, model, probe, "ablated") | _plots(attention(model, probe.batch), probe, spec)
    return out


def cleared_ablated(note: str = "") -> dict[str, Any]:
    return {"ablated": table(), "ablated_note": note} | _plots(None, None)


def lens_parts(cfg: RunConfig, model: Transformer, probe: Optional[ProbeInput], step: int) -> dict[str, Any]:
    """The logit lens of `model` (its weights from `step`, which the note says) on the probe."""
    if cfg.model.arch in RECURRENT:
        return {"lens": gr.Plot(None, visible=False), "lens_note": NO_ATTENTION.format(arch=cfg.model.arch.upper())
                + " No logit lens here: it reads a Transformer's residual stream."}
    if probe is None:
        return {"lens": gr.Plot(None, visible=False), "lens_note": SEE_NOTE}
    fig = lens_figure(logit_lens(model, cfg, probe.batch), probe.dec_labels)
    return {"lens": gr.Plot(fig, visible=True), "lens_note": LENS_NOTE.format(step=step)}


def importance_parts(cfg: RunConfig, model: Transformer, maps: list, step: Optional[int] = None) -> dict[str, Any]:
    """The importance grid and its sentence, which says what it was measured on (`step`: the weights')."""
    beside = maps[0].beside()  # exact-match; induction: accuracy on the predictable positions; text: none
    then = "" if beside is None else f", then {beside[0]}"
    note = (f"**{importance_sentence(maps, step)}** Each cell: the change in held-out loss when that head alone is "
            f"knocked out ({maps[0].mode}){then}. The ★ cell is that head. Click a cell to knock that head out.")
    return {"grid": table(importance_frame(maps)), "grid_note": note}


def compute_maps(ctx: AppContext, cache: MapCache, run_id: str, cfg: RunConfig, model: Transformer, step: int,
                 mode: Any) -> list:
    """The importance maps of every attention kind of the run (cached per run, final step and mode)."""
    if mode not in MODES:
        raise ConfigError("Knockout", f"{mode!r} is not one of {', '.join(MODES)}")
    if cfg.model.arch in RECURRENT:
        raise ConfigError("Head importance", f"this {cfg.model.arch.upper()} run has no attention heads to knock out "
                                             "(skip a whole layer under Skip block instead)")
    key = (run_id, step, mode)
    maps = cache.get(key)
    if maps is None:
        kinds = (DEC_SELF, ENC_SELF, CROSS) if cfg.model.arch == "encoder-decoder" else (DEC_SELF,)
        maps = [importance_map(model, cfg, kind, mode) for kind in kinds]
        cache.put(key, maps)
    return maps


def generated_text(cfg: RunConfig, model: Transformer, prompt: Any, temperature: Any, n_tokens: Any,
                   seed: int = 0) -> str:
    """The tokens a decoder run writes after `prompt` (its task's input up to the separator, or a language
    model's sequence), as labels; sampled with `seed` (unused at temperature 0: greedy)."""
    try:
        temp, n = float(temperature), float(n_tokens)
    except (TypeError, ValueError):
        raise ConfigError("Temperature", "temperature and tokens to generate must be numbers") from None
    if not (1 <= n <= 200 and n.is_integer()):
        raise ConfigError("Tokens to generate", f"{n_tokens} (allowed: a whole number from 1 to 200)")
    if not 0 <= temp <= 2:
        raise ConfigError("Temperature", f"{temperature} (allowed: 0 to 2; 0 is greedy)")
    if not isinstance(prompt, str) or len(prompt) > MAX_TEXT:
        raise ConfigError("Prompt", f"must be text of at most {MAX_TEXT} characters")
    try:
        tokens = generation_prompt(cfg, prompt)  # (1, T)
    except ConfigError as exc:
        raise ConfigError("Prompt", str(exc).split(": ", 1)[-1]) from None
    return tokens_text(cfg, generate(model, cfg, tokens, int(n), temp, seed))


def controls(cfg: Optional[RunConfig]) -> dict[str, Any]:
    """The intervention controls built for the run (values reset), and whether generation is offered."""
    if cfg is None:
        heads: list[str] = []
        layers: list[str] = []
        ff, decoder = True, False
    else:
        m, encdec, recurrent = cfg.model, cfg.model.arch == "encoder-decoder", cfg.model.arch in RECURRENT
        heads = [] if recurrent else [f"{p}{layer}.{h}" for p in ("", "enc.", "cross.")[: 3 if encdec else 1]
                                      for layer in range(m.n_layers) for h in range(m.n_heads)]
        layers = [f"{p}{layer}" for p in ("", "enc.")[: 2 if encdec else 1] for layer in range(m.n_layers)]
        ff, decoder = m.d_ff > 0 and not recurrent, not encdec
    recurrent = cfg is not None and cfg.model.arch in RECURRENT
    why = f"none: a recurrent model ({cfg.model.arch.upper()}) has " if recurrent else ""
    return {"heads": gr.CheckboxGroup(choices=heads, value=[]), "mode": "zero",
            "positional": gr.Radio(value="intact", interactive=not recurrent,
                                   info=f"{why}no positional encoding" if recurrent else POSITIONAL_INFO),
            "importance_btn": gr.Button("Compute head importance" + (f" ({why}no heads)" if recurrent else ""),
                                        interactive=not recurrent),
            "skip_ff": gr.CheckboxGroup(choices=layers if ff else [], value=[], interactive=ff, label=(
                "Skip feed-forward (layers)" if ff else "Skip feed-forward (none: d_ff = 0)" if cfg is None or
                cfg.model.arch not in RECURRENT else "Skip feed-forward (none: a recurrent model)")),
            "skip_block": gr.CheckboxGroup(choices=layers, value=[]), "gen_col": gr.Column(visible=decoder)}


def cleared(cfg: Optional[RunConfig], note: str = "") -> dict[str, Any]:
    """Every panel empty, the controls built for `cfg`'s run."""
    return controls(cfg) | cleared_ablated() | {
        "weights_note": note, "answer": table(), "answer_note": "", "metrics": table(), "applied_note": "",
        "grid": table(), "grid_note": "", "lens": gr.Plot(None, visible=False), "lens_note": "", "gen_out": "",
        "gen_note": ""}


def page_probe(cfg: RunConfig, source: Any, text: Any) -> Optional[ProbeInput]:
    """The probe input, or None for a typed input the note beside its box already refuses."""
    try:
        return probe_input(cfg, source, text)
    except ConfigError:
        if source != "typed":
            raise
        return None


# ---- the page and the API --------------------------------------------------------------------------
API = {  # endpoint -> (parameters, outputs by name); each takes everything explicitly
    "answer": (["run_id", "source", "text"], ["answer", "answer_note"]),
    "intervene": (["run_id", "source", "text", "heads", "mode", "skip_ff", "skip_block", "positional"],
                  ["metrics", "ablated", "ablated_note", *(f"attn_{k}" for k in KINDS), "applied_note"]),
    "importance": (["run_id", "mode"], ["grid", "grid_note"]),
    "logit_lens": (["run_id", "source", "text"], ["lens", "lens_note"]),
    "generate": (["run_id", "prompt", "temperature", "n_tokens"], ["gen_out"]),
}


def api_call(ctx: AppContext, cache: MapCache, name: str, run_id: Any, *args: Any) -> tuple:
    """One API endpoint's outputs (`API`): the run's final weights, the probe or prompt, nothing remembered."""
    cfg, model, step = final_model(ctx, run_id)
    if name == "answer":
        out = answer_parts(cfg, model, probe_input(cfg, *args))
    elif name == "intervene":
        out = ablated_parts(cfg, model, spec_from(*args[2:]), probe_input(cfg, *args[:2]), step)
    elif name == "importance":
        out = importance_parts(cfg, model, compute_maps(ctx, cache, run_id, cfg, model, step, args[0] or "zero"),
                               step)
    elif name == "logit_lens":
        out = lens_parts(cfg, model, probe_input(cfg, *args), step)
    else:
        out = {"gen_out": generated_text(cfg, model, *args)}
    values = tuple(out[k] for k in API[name][1])
    return values if len(values) > 1 else values[0]
