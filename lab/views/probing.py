"""What a trained model answers, and how interventions change it (pure functions behind Inspect, the
CLI's `ablate` and `sample`, and the Learn page on interventions).

- `greedy_answer`: the model's answer to one input, decoded greedily token by token (each token fed
  back), with its probability, the right answer beside it and right or wrong. Language-model tasks
  are read as next-token predictions at every scored position (teacher forcing).
- `generate`: free generation from a prompt for decoder-only runs (temperature, number of tokens;
  a sliding context window as minGPT's `generate`).
- `ablation_report`: held-out metrics of the intact and the intervened model (lab/interventions.py).
- `importance_map`: layers x heads, how much knocking out each head alone changes held-out loss and
  exact-match, one forward pass per head over a fixed held-out batch (Michel et al. 2019);
  `knockout_summary` and `median_ratio` are what the presets, Inspect and Learn quote of it.

What a task's numbers are read by (`quoted`, from lab.tasks.shapes.headline_metrics): a language model of
real text (`text`) by its loss only, never right on a whole window; induction by its loss and its accuracy
on the predictable positions (its exact-match counts the first token of each repeat, which nothing
predicts); the other tasks by loss, token accuracy and exact-match.
- `logit_lens`: what the model would predict if the stack stopped after each layer: the residual
  stream through the final norm and the head (nostalgebraist 2020, "interpreting GPT: the logit lens").

One held-out set for every number a sentence quotes: the run's own evaluation set (`held_out_size`: its
`eval_samples` sequences, at most HELD_OUT), the very batches its training evaluated on. So the intact
model's held-out loss here equals the run's final evaluation, and the preset card, Inspect, Learn and the
CLI quote one value; `measured_on` says in words what it was measured on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from lab.config import ConfigError, RunConfig
from lab.hooks import hooks_on
from lab.interventions import HeadRef, Interventions, applied, head_means, head_name
from lab.model import Transformer
from lab.tasks.batches import IGNORE_INDEX, Batch, eval_batches, get_task
from lab.tasks.shapes import headline_metrics, loss_baselines
from lab.records import DEC_SELF, EXACT_MATCH, LOSS, TOKEN_ACC, AttentionKind

HELD_OUT = 512  # at most this many held-out sequences per measurement (a map is one pass per head)
MATTERS = 0.01  # nats: a change of held-out loss smaller than this is noise, and no ratio is taken of it


def held_out_size(cfg: RunConfig) -> int:
    """Sequences in the held-out set every quoted measurement uses: the run's own evaluation set
    (train.eval_samples, the batches its training evaluated on), at most HELD_OUT."""
    return max(1, min(int(cfg.train.eval_samples), HELD_OUT))


def measured_on(n: int, step: Optional[int] = None) -> str:
    """What a held-out number was measured on, for its sentence: "512 held-out sequences at step 800"."""
    return f"{n} held-out sequence{'s' if n != 1 else ''}" + ("" if step is None else f" at step {step}")


def held_out(cfg: RunConfig, split: str = "eval", n: Optional[int] = None) -> list[Batch]:
    """The fixed held-out batches ("eval": training lengths, "ood": longer ones; [] where none) of `n`
    sequences (default: `held_out_size`, the run's own evaluation set)."""
    task = get_task(cfg.task.name)
    if split == "ood" and not task.has_ood:
        return []
    return eval_batches(cfg.task, cfg.model.arch, split, held_out_size(cfg) if n is None else n)


def quoted(task: str) -> tuple[str, ...]:
    """The metrics the ablation table and the knockout sentence quote for task `task`, most telling first:
    a language-model task's headline metrics (text: "loss"; induction: "loss", "predictable_acc"), else
    "loss", "token_acc" and "exact_match"."""
    head = headline_metrics(task)
    return head if get_task(task).lm else (LOSS, TOKEN_ACC, EXACT_MATCH)


@torch.no_grad()
def metrics(model: Transformer, batches: list[Batch], task: str = "") -> Optional[dict[str, float]]:
    """{"loss", "token_acc", "exact_match"} over the scored positions of `batches` (None if none), and
    "predictable_acc" where task `task` (induction) marks predictable positions."""
    from lab.evaluation import measure  # one definition of the held-out metrics

    if not batches:
        return None
    m = measure(model, batches, torch.device("cpu"), get_task(task).predictable if task else None)
    out = {LOSS: m.loss, TOKEN_ACC: m.token_acc, EXACT_MATCH: m.exact_match}
    return out if m.predictable_acc is None else out | {"predictable_acc": m.predictable_acc}


def means_for(model: Transformer, cfg: RunConfig, spec: Interventions, batches: Optional[list[Batch]] = None):
    """Head means over the held-out set (`batches`, else made here) when `spec` asks for mean ablation,
    else None."""
    if spec.mode != "mean" or not spec.heads:
        return None
    return head_means(model, held_out(cfg) if batches is None else batches)


def ablation_report(model: Transformer, cfg: RunConfig, spec: Interventions, n: Optional[int] = None,
                    means: Optional[dict] = None) -> dict:
    """{"intact": {"eval": .., "ood": ..}, "ablated": {...}, "interventions": [..], "n": sequences,
    "quoted": [metric keys]}: held-out metrics at training lengths and at longer ones (None where the task has
    none), before and with `spec` (`means`: the head means of mean ablation, when the caller has them), on
    `n` held-out sequences (default: `held_out_size`); "quoted" names those that mean something for the
    task, most telling first (`quoted`)."""
    spec.check(model)
    n = held_out_size(cfg) if n is None else n
    task = cfg.task.name
    splits = {s: held_out(cfg, s, n) for s in ("eval", "ood")}
    intact = {s: metrics(model, b, task) for s, b in splits.items()}
    if means is None:
        means = means_for(model, cfg, spec, splits["eval"])
    with applied(model, spec, means):
        ablated = {s: metrics(model, b, task) for s, b in splits.items()}
    return {"intact": intact, "ablated": ablated, "interventions": spec.describe(), "n": n,
            "quoted": list(quoted(task))}


# ---- the model's answer -------------------------------------------------------------------------
@dataclass(frozen=True)
class AnswerToken:
    predicted: str
    probability: float  # of the predicted token
    expected: Optional[str]  # None where the position is not scored (language models)
    right: Optional[bool]


@dataclass(frozen=True)
class Answer:
    tokens: tuple[AnswerToken, ...]
    greedy: bool  # decoded token by token (seq2seq); False: next-token predictions (language models)

    @property
    def scored(self) -> list[AnswerToken]:
        return [t for t in self.tokens if t.right is not None]

    @property
    def exact(self) -> bool:
        return bool(self.scored) and all(t.right for t in self.scored)


def _first_scored(tgt: torch.Tensor) -> int:
    scored = (tgt[0] != IGNORE_INDEX).nonzero()
    return int(scored[0]) if len(scored) else tgt.shape[1]


@torch.no_grad()
def greedy_answer(model: Transformer, cfg: RunConfig, batch: Batch) -> Answer:
    """The model's answer to the first sample of `batch` (made by the task's layout or parse_probe)."""
    task = get_task(cfg.task.name)
    label = lambda t: task.label(cfg.task, int(t))  # noqa: E731
    inp, tgt = batch.inp[:1], batch.tgt[:1]
    src = None if batch.src is None else batch.src[:1]
    if task.lm:
        probs = model(inp, src).logits[0].softmax(-1)  # (T, vocab)
        out = []
        for t in range(inp.shape[1]):
            p, tok = probs[t].max(-1)
            want = int(tgt[0, t])
            known = want != IGNORE_INDEX
            out.append(AnswerToken(label(tok), float(p), label(want) if known else None,
                                   (int(tok) == want) if known else None))
        return Answer(tuple(out), greedy=False)
    start = _first_scored(tgt)  # the answer's first token is predicted at this position
    ctx = inp[:, : start + 1]  # (1, prompt + SEP) or (1, SEP) for an encoder-decoder
    out = []
    for t in range(start, tgt.shape[1]):
        probs = model(ctx, src).logits[0, -1].softmax(-1)  # (vocab,)
        p, tok = probs.max(-1)
        want = int(tgt[0, t])
        out.append(AnswerToken(label(tok), float(p), label(want), int(tok) == want))
        ctx = torch.cat([ctx, tok.view(1, 1)], 1)  # (1, T + 1): its own answer is fed back
    return Answer(tuple(out), greedy=True)


@torch.no_grad()
def generate(model: Transformer, cfg: RunConfig, prompt: torch.Tensor, n_tokens: int,
             temperature: float = 1.0, seed: int = 0) -> list[int]:
    """`n_tokens` new tokens after `prompt` (1, T) from a decoder-only model: sampled at `temperature`
    (0: greedy), the context cropped to the last n_ctx tokens."""
    if cfg.model.arch == "encoder-decoder":
        raise ConfigError("Generate", "free generation needs a decoder run (an encoder-decoder answers its input only)")
    if not 1 <= n_tokens <= 1000:
        raise ConfigError("Tokens to generate", f"{n_tokens} (allowed: 1 to 1000)")
    if not (math.isfinite(temperature) and 0 <= temperature <= 5):
        raise ConfigError("Temperature", f"{temperature} (allowed: 0 to 5; 0 is greedy)")
    gen = torch.Generator().manual_seed(seed)
    idx, new = prompt[:1], []
    for _ in range(n_tokens):
        logits = model(idx[:, -cfg.model.n_ctx:]).logits[0, -1]  # (vocab,)
        if temperature == 0:
            tok = logits.argmax()
        else:
            tok = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen)[0]
        new.append(int(tok))
        idx = torch.cat([idx, tok.view(1, 1)], 1)
    return new


# ---- head importance ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImportanceMap:
    kind: AttentionKind
    loss: np.ndarray  # (layers, heads): held-out loss with that head knocked out
    exact: np.ndarray  # (layers, heads): exact-match with it knocked out
    intact_loss: float
    intact_exact: float
    mode: str
    n: int  # held-out sequences measured on
    task: str = ""  # the run's task: what the sentence quotes beside the loss (`beside`)
    predictable: Optional[np.ndarray] = None  # (layers, heads): induction's accuracy on the predictable positions
    intact_predictable: Optional[float] = None
    unigram: Optional[float] = None  # text: the unigram baseline (nats a character), quoted beside its loss

    def ranked(self) -> list[tuple[HeadRef, float]]:
        """Heads by how much their knockout raises the loss, most first: (head, loss increase)."""
        rise = self.loss - self.intact_loss
        order = np.argsort(-rise, axis=None, kind="stable")
        return [(HeadRef(self.kind, int(i) // rise.shape[1], int(i) % rise.shape[1]), float(rise.flat[i]))
                for i in order]

    def beside(self) -> Optional[tuple[str, np.ndarray, float]]:
        """(name, grid, intact) of the accuracy quoted beside the loss: induction's accuracy on the predictable
        positions, exact-match for the sequence tasks; None for text, read by its loss alone (`quoted`)."""
        keys = quoted(self.task) if self.task else (LOSS, EXACT_MATCH)
        if "predictable_acc" in keys and self.predictable is not None and self.intact_predictable is not None:
            return "accuracy on the predictable positions", self.predictable, self.intact_predictable
        return ("exact-match", self.exact, self.intact_exact) if EXACT_MATCH in keys else None

    def sentence(self, step: Optional[int] = None) -> str:
        """"knocking out layer 1 head 0 raises held-out loss from 0.60 to 2.90 (exact-match 90% to 10%; 512
        held-out sequences at step 800)" for the head ranked first (`step`: of the weights, where known);
        induction quotes its accuracy on the predictable positions instead of exact-match, text the unigram
        baseline its loss is read against: "... from 1.20 to 2.10 nats a character (the unigram baseline, a
        model that ignores context: 2.94; 512 held-out sequences ...)"."""
        top, _ = self.ranked()[0]
        beside, unit = self.beside(), ""
        what = [measured_on(self.n, step)]
        if beside is not None:
            name, grid, intact = beside
            what.insert(0, f"{name} {intact:.0%} to {grid[top.layer, top.head]:.0%}")
        elif self.unigram is not None:
            unit = " nats a character"
            what.insert(0, f"the unigram baseline, a model that ignores context: {self.unigram:.2f}")
        return (f"knocking out {head_name(top.layer, top.head)} raises held-out loss from {self.intact_loss:.2f} "
                f"to {self.loss[top.layer, top.head]:.2f}{unit} ({'; '.join(what)})")


def knockout_summary(imp: ImportanceMap) -> dict:
    """The head ranked first and how its knockout compares with the median head's: what a preset's
    explanation and Learn's caption quote ({"head": "1.0", "layer", "index", "intact", "ablated", "rise",
    "median_rise", "n": held-out sequences})."""
    ranked = imp.ranked()
    top, rise = ranked[0]
    return {"head": str(top), "layer": top.layer, "index": top.head, "intact": imp.intact_loss,
            "ablated": float(imp.loss[top.layer, top.head]), "rise": rise,
            "median_rise": float(np.median([r for _, r in ranked])), "n": imp.n}


def median_ratio(rise: float, median_rise: float) -> Optional[float]:
    """How many times the top head's knockout raises the held-out loss as much as the median head's; None
    where the median head changes nothing measurable or lowers the loss (median_rise < MATTERS): a ratio to
    noise is meaningless (it printed 495876417.5x for a median of 0), so quote the two rises instead."""
    return rise / median_rise if median_rise >= MATTERS else None


def importance_map(model: Transformer, cfg: RunConfig, kind: AttentionKind = DEC_SELF, mode: str = "zero",
                   n: Optional[int] = None) -> ImportanceMap:
    """Each head of one attention kind knocked out alone, over one fixed held-out batch of `n` sequences
    (default: `held_out_size`, the run's own evaluation set, so the intact loss is its final evaluation's)."""
    n = held_out_size(cfg) if n is None else n
    task = cfg.task.name
    batches = held_out(cfg, "eval", n)
    means = head_means(model, batches) if mode == "mean" else None
    intact = metrics(model, batches, task)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    loss, exact = np.zeros((L, H)), np.zeros((L, H))
    sure = np.zeros((L, H)) if "predictable_acc" in intact else None
    for layer in range(L):
        for head in range(H):
            with applied(model, Interventions(heads=(HeadRef(kind, layer, head),), mode=mode), means):
                m = metrics(model, batches, task)
            loss[layer, head], exact[layer, head] = m[LOSS], m[EXACT_MATCH]
            if sure is not None:
                sure[layer, head] = m["predictable_acc"]
    return ImportanceMap(kind, loss, exact, intact[LOSS], intact[EXACT_MATCH], mode, n, task, sure,
                         intact.get("predictable_acc"), loss_baselines(cfg.task).unigram)


# ---- logit lens -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lens:
    rows: tuple[str, ...]  # "embedding", "after layer 0", ...
    top: tuple[tuple[str, ...], ...]  # (rows, T) labels of the most likely next token
    top_prob: np.ndarray  # (rows, T)
    target_prob: np.ndarray  # (rows, T): probability of the right next token (nan where not scored)


@torch.no_grad()
def logit_lens(model: Transformer, cfg: RunConfig, batch: Batch) -> Lens:
    """For the first sample: the decoder's residual stream after the embedding and after each block,
    through the final norm and the head."""
    task = get_task(cfg.task.name)
    streams: list[torch.Tensor] = []
    points = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(len(model.decoder))]
    with hooks_on(model.hook_dict, [(p, lambda x, hook: streams.append(x[:1])) for p in points]):
        model(batch.inp[:1], None if batch.src is None else batch.src[:1])
    probs = torch.stack([model.head(model.dec_norm(s))[0].softmax(-1) for s in streams])  # (L + 1, T, vocab)
    top_prob, top = probs.max(-1)  # (L + 1, T)
    tgt = batch.tgt[0]
    scored = tgt != IGNORE_INDEX
    target = probs.gather(-1, tgt.clamp(min=0)[None, :, None].expand(len(streams), -1, 1))[..., 0]  # (L + 1, T)
    target = torch.where(scored[None, :], target, torch.full_like(target, float("nan")))
    labels = tuple(tuple(task.label(cfg.task, int(t)) for t in row) for row in top)
    rows = ("embedding",) + tuple(f"after layer {i}" for i in range(cfg.model.n_layers))
    return Lens(rows, labels, top_prob.numpy(), target.numpy())
