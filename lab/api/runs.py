"""Runs from Python: `train` one in this process, `load_run` / `list_runs` stored ones, and the `Run` handle
that reads a run's metrics, model, attention and held-out numbers (the public API, docs/python-api.md).

A run trains exactly as `python -m lab train` trains it (lab/engine/recorder.py record_run): it is created in
a run store (a folder: `runs_dir`, else $LAB_RUNS_DIR, else ./runs), recorded step by step and kept there, so
the app's Compare and Inspect tabs and the command line see it too. The progress bar is tqdm.auto's: a
widget in Jupyter (with ipywidgets), a text bar in a terminal.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from lab.api.configs import make_config
from lab.config import RECURRENT, ConfigError, RunConfig
from lab.engine.store import RunStore
from lab.records import DEC_SELF, AttentionKind, EvalRecord, Record, StepRecord

if TYPE_CHECKING:
    import torch

    from lab.api.cache import ActivationCache, HookFn
    from lab.interventions import Interventions
    from lab.model import Transformer
    from lab.views.analysis import ProbeInput

PathLike = str | os.PathLike


class Run:
    """A stored run: `train` returns one, `load_run` opens one. Reading never changes the run."""

    def __init__(self, run_id: str, runs_dir: Optional[PathLike] = None) -> None:
        self.store = RunStore(runs_dir)
        if not self.store.exists(run_id):  # a malformed id raises RunIdError (a ValueError) here
            raise FileNotFoundError(f"run_id: {run_id!r} does not exist in the run store {str(self.store.root)!r}")
        self.run_id = run_id
        self._model: Optional[Transformer] = None
        self.active_hooks: Optional[Interventions] = None  # the spec of the `hooks` block running, if any

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, state={self.state!r}, runs_dir={str(self.store.root)!r})"

    @property
    def path(self) -> Path:
        """The run's folder (config.json, metrics.jsonl, weights.safetensors, ...)."""
        return self.store.path(self.run_id)

    @property
    def config(self) -> RunConfig:
        return self.store.config(self.run_id)

    @property
    def name(self) -> str:
        """The run's label: its config's name, else its id."""
        return self.config.name or self.run_id

    @property
    def state(self) -> str:
        """queued, running, completed, stopped, failed or interrupted."""
        return str(self.store.status(self.run_id).get("state"))

    @property
    def summary(self) -> dict[str, Any]:
        """The final numbers: params, steps, train_loss, eval / ood / train_set metrics, wall_s ({} before the
        run ends)."""
        return self.store.summary(self.run_id) or {}

    def metrics(self, kind: Optional[str] = None) -> pd.DataFrame:
        """Every logged record as a DataFrame: one row per record, `kind` "train" (a step's batch loss, lr,
        grad_norm, tokens, elapsed_s) or "eval" (held-out loss, token_acc, exact_match, ood_*, train_*);
        `kind` keeps one of them."""
        frame = self.store.metrics(self.run_id)
        if kind is not None:
            if kind not in ("train", "eval"):
                raise ValueError(f"kind: {kind!r} is not one of train, eval")
            frame = frame[frame["kind"] == kind].dropna(axis=1, how="all").reset_index(drop=True)
        return frame

    def curve(self, metric: str = "held-out loss", x: str = "step") -> pd.DataFrame:
        """One of Compare's curves as a DataFrame with columns step, x, value (`metric`: a label of
        `lab.plot_curves`' metric list, e.g. "train loss (batch)", "held-out exact-match"; `x`: step,
        time (s) or tokens)."""
        from lab.views.curves import CURVES, X_AXES, curve

        if metric not in CURVES:
            raise ValueError(f"metric: {metric!r} is not one of {', '.join(CURVES)}")
        if x not in X_AXES:
            raise ValueError(f"x: {x!r} is not one of {', '.join(X_AXES)}")
        m = self.store.metrics(self.run_id)
        out = curve(m, metric, x)
        kind, col = CURVES[metric]
        steps = m[m["kind"] == kind].dropna(subset=[X_AXES[x], col])["step"] if not m.empty else []
        return out.assign(step=np.asarray(steps, dtype=int))[["step", "x", "value"]]

    # ---- the model ----------------------------------------------------------------------------------
    @property
    def model(self) -> Transformer:
        """The trained model (final weights, on the CPU, in eval mode), loaded once; `hooks` change it."""
        if self._model is None:
            self._model = self.load_model()
        return self._model

    def load_model(self, step: Optional[int] = None) -> Transformer:
        """A fresh copy of the model: the final weights, or those kept with the attention snapshot at `step`
        (`snapshot_steps`; models up to 1M parameters keep them)."""
        from lab.views.analysis import load_model

        weights, _ = self.store.weights_at(self.run_id, step)
        return load_model(self.config, weights)

    def snapshot_steps(self) -> list[int]:
        """The steps at which training saved the probe's attention (and the weights), oldest first."""
        return self.store.snapshot_steps(self.run_id)

    def probe(self, text: Optional[str] = None) -> ProbeInput:
        """The input the figures read: the run's fixed sampled probe, or `text` typed as in Inspect ("3 1 4 1
        5"; "12+34" for addition; a text run's characters), with the right answer."""
        from lab.views.analysis import parse_probe, sampled_probe

        return sampled_probe(self.config) if text is None else parse_probe(self.config, text)

    def to_str_tokens(self, text: Optional[str] = None) -> list[str]:
        """The decoder's input tokens of `probe(text)` as strings (TransformerLens's name)."""
        return list(self.probe(text).dec_labels)

    def attention(self, text: Optional[str] = None, step: Optional[int] = None,
                  kind: AttentionKind = DEC_SELF) -> np.ndarray:
        """Attention patterns on `probe(text)`: an array (n_layers, n_heads, query, key), each row summing to 1.
        `step`: the weights kept at that snapshot instead of the final ones; `kind`: dec_self, or for an
        encoder-decoder enc_self or cross. Inside `hooks(...)` the hooked model is read."""
        from lab.views.analysis import attention

        if self.config.model.arch in RECURRENT:
            raise ValueError(f"model.arch: this run is {self.config.model.arch}, a recurrent baseline: it has no "
                             "attention to read; pick a Transformer run")
        model = self.model if step is None else self.load_model(step)
        patterns = attention(model, self.probe(text).batch)
        if kind not in patterns:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(patterns)}")
        return patterns[kind]

    def answer(self, text: Optional[str] = None) -> pd.DataFrame:
        """The model's answer to `probe(text)` token by token, as Inspect shows it: decoded greedily, each token
        fed back (a language model: its next-token prediction at every position), a row per token with columns
        predicted, expected (None where nothing is scored), right and probability (of the predicted token)."""
        from lab.views.probing import greedy_answer

        answer = greedy_answer(self.model, self.config, self.probe(text).batch)
        return pd.DataFrame([{"predicted": t.predicted, "expected": t.expected, "right": t.right,
                              "probability": t.probability} for t in answer.tokens],
                            columns=["predicted", "expected", "right", "probability"])

    def generate(self, prompt: str, max_new_tokens: int = 20, temperature: float = 0.0, seed: int = 0) -> str:
        """What a decoder run writes after `prompt` (typed as in Inspect; a sequence task's separator is added):
        `max_new_tokens` tokens, greedy at `temperature` 0, else sampled (reproducibly, from `seed`)."""
        from lab.views.analysis import generation_prompt, tokens_text
        from lab.views.probing import generate

        tokens = generate(self.model, self.config, generation_prompt(self.config, prompt), max_new_tokens,
                          temperature, seed)
        return tokens_text(self.config, tokens)

    def _tokens(self, inputs: Any) -> Any:
        """What `run_with_cache` and `run_with_hooks` run on: `probe(text)`'s batch for None or a string
        (typed as in Inspect), the probes of several strings of one length as a batch, else token ids [B, T]."""
        import torch

        from lab.tasks.batches import Batch

        if inputs is None or isinstance(inputs, str):
            return self.probe(inputs).batch
        if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, str) for t in inputs):
            batches = [self.probe(t).batch for t in inputs]
            if len({tuple(b.inp.shape) for b in batches}) > 1:
                raise ValueError("text: the strings of one batch must make sequences of one length, got "
                                 + ", ".join(str(b.inp.shape[1]) for b in batches) + " tokens")
            src = None if batches[0].src is None else torch.cat([b.src for b in batches])
            return Batch(torch.cat([b.inp for b in batches]), torch.cat([b.tgt for b in batches]), src)
        return inputs

    def run_with_cache(self, inputs: Any = None, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                       names_filter: Any = None, src: Any = None) -> tuple[torch.Tensor, ActivationCache]:
        """(logits, cache) of one forward pass, as TransformerLens's run_with_cache: on `probe(inputs)` for a
        string (or None: the run's probe), several strings of one length, or token ids [batch, pos] (an
        encoder-decoder also takes `src`); logits (B, T, vocab); the cache holds every hook point's activation
        whose name passes `names_filter` (lab/api/cache.py), after any `hooks` and `fwd_hooks` changed them."""
        from lab.api.cache import run_with_cache

        return run_with_cache(self.model, self._tokens(inputs), fwd_hooks, names_filter, src)

    def run_with_hooks(self, inputs: Any = None, fwd_hooks: Sequence[tuple[str, HookFn]] = (),
                       src: Any = None) -> torch.Tensor:
        """The logits (B, T, vocab) with hook functions on, as TransformerLens's: each (hook point, function)
        of `fwd_hooks` gets (activation, hook) and returns its replacement or None; `inputs` as in
        `run_with_cache`; hook points: lab/api/cache.py (`blocks.1.hook_resid_pre`, `blocks.0.attn.hook_q`...)."""
        from lab.api.cache import run_with_hooks

        return run_with_hooks(self.model, self._tokens(inputs), fwd_hooks, src)

    @contextlib.contextmanager
    def hooks(self, heads: Any = (), mode: str = "zero", skip_attn: Any = (), skip_ff: Any = (),
              skip_block: Any = (), positional: str = "intact",
              fwd_hooks: Sequence[tuple[str, HookFn]] = ()) -> Iterator[Transformer]:
        """Interventions on `model` for the block's duration, as Inspect's: knock out `heads` ("1.0 1.2", or
        (layer, head) pairs; `mode` "zero" or "mean": the head's output replaced by zeros or by its mean over
        the held-out set), skip layers' attention, feed-forward or whole blocks (layer numbers), remove or
        shuffle the positional encoding (`positional` "none" or "shuffle"), and TransformerLens's `fwd_hooks`
        (see `run_with_hooks`). Everything read inside (evaluate, attention, run_with_cache, the figures) sees
        the changed model; the weights never change."""
        from lab.api.cache import hooked, interventions
        from lab.interventions import applied
        from lab.views.probing import held_out, means_for

        spec = interventions(heads, mode, skip_attn, skip_ff, skip_block, positional)
        spec.check(self.model)
        means = means_for(self.model, self.config, spec, held_out(self.config)) if spec.mode == "mean" else None
        if self.active_hooks is not None:
            raise ValueError("hooks: already inside a hooks block of this run; combine the interventions in one")
        with applied(self.model, spec, means) as model, hooked(model, fwd_hooks):
            self.active_hooks = spec
            try:
                yield model
            finally:
                self.active_hooks = None

    # ---- the app's analyses as numbers (lab/api/analyses.py) ------------------------------------------
    def head_roles(self, step: Optional[int] = None, seed: int = 0) -> pd.DataFrame:
        """Each head's role scores (previous-token, induction, ...), a row per (layer, head); `step`: the
        weights kept at that snapshot."""
        from lab.api.analyses import head_roles

        return head_roles(self, step, seed)

    def patching(self, clean: Optional[str] = None, corrupt: Optional[str] = None) -> Any:
        """Activation patching's two grids (`PatchingGrids`) on two typed inputs of one length, or the task's
        own pair."""
        from lab.api.analyses import patching

        return patching(self, clean, corrupt)

    def fourier(self, step: Optional[int] = None) -> pd.DataFrame:
        """A modular-addition run's number embedding in the Fourier basis: power and share per frequency."""
        from lab.api.analyses import fourier

        return fourier(self, step)

    def logit_lens(self, text: Optional[str] = None) -> pd.DataFrame:
        """The logit lens on `probe(text)`: each stream's top next token and probabilities, per position."""
        from lab.api.analyses import logit_lens

        return logit_lens(self, text)

    def accuracy_by_length(self, per_length: int = 64) -> pd.DataFrame:
        """Held-out token accuracy and exact-match at each input length (training lengths, then the longer
        ones), a row per length: where a model that learned the training lengths stops being right."""
        from lab.api.analyses import accuracy_by_length

        return accuracy_by_length(self, per_length)

    def evaluate(self, split: str = "eval", n: Optional[int] = None) -> dict[str, float]:
        """Held-out metrics of `model` now (loss, token_acc, exact_match; predictable_acc for induction) on the
        run's own evaluation set (`split` "eval") or at longer lengths ("ood"), `n` sequences (default: the
        run's eval_samples, at most 512). Intact, it equals the run's final evaluation."""
        from lab.views.probing import held_out, metrics

        if split not in ("eval", "ood"):
            raise ValueError(f"split: {split!r} is not one of eval, ood")
        result = metrics(self.model, held_out(self.config, split, n), self.config.task.name)
        if result is None:
            raise ValueError(f"split: task {self.config.task.name!r} has no {split!r} set")
        return result

    def importance(self, mode: str = "zero", kind: AttentionKind = DEC_SELF) -> pd.DataFrame:
        """How much knocking out each head alone raises the held-out loss: a DataFrame, rows "layer L", columns
        "head H" (Inspect's importance map; `plot_importance` draws it)."""
        imp = self.importance_map(mode, kind)
        rise = imp.loss - imp.intact_loss
        return pd.DataFrame(rise, index=[f"layer {i}" for i in range(rise.shape[0])],
                            columns=[f"head {h}" for h in range(rise.shape[1])])

    def importance_map(self, mode: str = "zero", kind: AttentionKind = DEC_SELF) -> Any:
        from lab.views.probing import importance_map

        return importance_map(self.model, self.config, kind, mode)


def _progress_callback(total: int, start: int, label: str, enabled: bool) -> tuple[Any, Any]:
    """A tqdm.auto bar over the steps, and the record callback that moves it (loss and held-out loss shown)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=start, desc=label, unit="step", disable=not enabled, dynamic_ncols=True)
    shown: dict[str, str] = {}

    def on_record(rec: Record) -> None:
        if isinstance(rec, StepRecord):
            bar.update(rec.step - bar.n)
            shown["loss"] = f"{rec.loss:.3f}"
        elif isinstance(rec, EvalRecord):
            shown["held-out"] = f"{rec.loss:.3f}"
        else:
            return
        bar.set_postfix(shown, refresh=False)
    return bar, on_record


def train(cfg: Optional[RunConfig] = None, /, *, runs_dir: Optional[PathLike] = None, progress: bool = True,
          threads: Optional[int] = None, **keywords: Any) -> Run:
    """Train one run in this process and return it, stored in `runs_dir` (default $LAB_RUNS_DIR, else ./runs).

    `cfg` (from `make_config`) and/or `make_config` keywords: `train(task="copy", steps=300)` is
    `train(make_config(task="copy", steps=300))`. `threads`: torch's CPU threads (default: the config's, else
    every core). Interrupting it (Ctrl-C, the notebook's stop button) ends the run, kept as "interrupted"."""
    from lab.engine.recorder import record_run
    from lab.trainer import resolve_device

    cfg = make_config(cfg, **keywords) if keywords or cfg is None else cfg
    if not isinstance(cfg, RunConfig):
        raise ConfigError("config", f"expected a RunConfig, got {type(cfg).__name__}")
    try:
        resolve_device(cfg.train.device)
    except ValueError as exc:
        raise ConfigError("train.device", str(exc).split(": ", 1)[-1]) from None
    store = RunStore(runs_dir)
    run_id = store.create(cfg, owner="python")
    bar, on_record = _progress_callback(cfg.train.steps, 0, cfg.name or cfg.task.name, progress)
    try:
        with _callers_threads():
            record_run(store, run_id, threads=threads, on_record=on_record)
    finally:
        bar.close()
    return Run(run_id, store.root)


@contextlib.contextmanager
def _callers_threads() -> Iterator[None]:
    """Training sets torch's CPU thread count (its `threads`); the caller's count comes back after it."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_many(cfgs: Sequence[RunConfig], /, *, runs_dir: Optional[PathLike] = None, progress: bool = True,
               threads: Optional[int] = None, batch_seeds: Optional[bool] = None) -> list[Run]:
    """Train several runs in this process (a `make_grid`, seed repeats) and return them in the same order,
    under one progress bar.

    With `batch_seeds`, runs that differ only in their seed, learning rate or name (decoder-only, without
    dropout) train together as one batched model, as the app trains seed repeats (lab/batched.py), each stored
    as if it had trained alone (equal to float32 round-off). By default (None) as the app decides: on with a
    CUDA GPU, where k seeds take about the time of one, off on a CPU, where batching is slower; LAB_BATCH_SEEDS
    (on, off) overrides it."""
    from tqdm.auto import tqdm

    from lab.batched import batch_key
    from lab.engine.environment import batch_seeds_default
    from lab.engine.recorder import record_runs

    cfgs = list(cfgs)
    for cfg in cfgs:
        if not isinstance(cfg, RunConfig):
            raise ConfigError("config", f"expected RunConfigs, got a {type(cfg).__name__}")
    batch_seeds = batch_seeds_default() if batch_seeds is None else batch_seeds
    groups: dict[Any, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        key = batch_key(cfg) if batch_seeds else None
        groups.setdefault(("alone", i) if key is None else key, []).append(i)
    store = RunStore(runs_dir)
    ids: dict[int, str] = {}
    bar = tqdm(total=sum(cfgs[m[0]].train.steps for m in groups.values()), desc=f"{len(cfgs)} runs",
               unit="step", disable=not progress, dynamic_ncols=True)
    try:
        for members in groups.values():
            group = [store.create(cfgs[i], owner="python") for i in members]
            ids.update(zip(members, group))
            done = bar.n

            def moved(rec: Record, done: int = done) -> None:
                if isinstance(rec, StepRecord):
                    bar.update(done + rec.step - bar.n)
            with _callers_threads():
                record_runs(store, group, threads=threads, on_record={group[0]: moved})
            bar.update(done + cfgs[members[0]].train.steps - bar.n)
    finally:
        bar.close()
    return [Run(ids[i], store.root) for i in range(len(cfgs))]


def load_run(run_id: str, runs_dir: Optional[PathLike] = None) -> Run:
    """A stored run by its id (`list_runs()["run_id"]`); FileNotFoundError where there is none."""
    return Run(run_id, runs_dir)


def list_runs(runs_dir: Optional[PathLike] = None) -> pd.DataFrame:
    """Every stored run as a DataFrame, oldest first: run_id, state, the config flat (task.name, model.pos,
    ...) and its final numbers (final.eval.loss, final.eval.exact_match, ...), as `python -m lab list --json`."""
    return RunStore(runs_dir).list()


def load_runs(runs: Sequence[Run | str] | Run | str, runs_dir: Optional[PathLike] = None) -> list[Run]:
    """Runs, run ids or one of either, as a list of Runs (what the figures accept)."""
    items = [runs] if isinstance(runs, (Run, str)) else list(runs)
    return [r if isinstance(r, Run) else Run(r, runs_dir) for r in items]
