"""Table 3 of "Attention Is All You Need" at toy scale: the paper's variations, each against the base model,
with 3 seeds, and a mark per row saying whether the toy result goes the paper's way.

Vaswani et al. 2017, Table 3 varies the base model (N = 6 layers, d_model 512, h = 8 heads of d_k = 64,
dropout 0.1, sinusoidal positions) on English-German translation and reports the development set's
perplexity (per word piece) and BLEU. This lab cannot translate; its nearest measurement is a language
model's perplexity, so the toy experiment trains a character-level model on the built-in text (the `text`
task: held-out perplexity = exp(held-out loss), lower is better), a task where every row's knob can matter:
width and depth (capacity), heads and d_k (how many positions a layer can read at once), dropout (a small
text is easy to memorise), positions (order matters in text). What each row measured: benchmarks/RESULTS.md
("Table 3 at toy scale"); where it disagrees with the paper: docs/SCIENCE.md.

The rows kept are the ones whose values this project carries (docs/SCIENCE.md, "Table 3 at toy scale").
The toy base has 3 layers (the paper's 6) and every width divided by 8 (d_model 64, 8 heads of d_k 8, d_ff
256); each row changes what the paper's row changes, in the same proportion (row C keeps a third of the
layers, as N = 2 does of 6; row B a quarter of d_k, as 16 does of 64, though the toy's d_head knob narrows
d_v with it where the paper kept d_v at 64: docs/SCIENCE.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.derived import run_config

SEEDS = (0, 1, 2)
SAME, OPPOSITE, SPREAD = "same direction as the paper", "opposite", "within the seeds' spread"


@dataclass(frozen=True)
class Row:
    key: str  # "A h=1"
    group: str  # the paper's row group: A (heads at constant compute), B (d_k), C (size), D (regularisation), E
    what: str  # the variation in words, as the paper's table states it
    model: Mapping[str, Any]  # the toy model's changed fields
    train: Mapping[str, Any]  # the toy training's changed fields
    ppl: float  # the paper's development perplexity for this row
    bleu: float  # and BLEU

    @property
    def paper_sign(self) -> int:
        """+1 if the paper found this row worse than the base, -1 better: by perplexity, ties by BLEU."""
        if not math.isclose(self.ppl, BASE_ROW.ppl):
            return 1 if self.ppl > BASE_ROW.ppl else -1
        return 1 if self.bleu < BASE_ROW.bleu else -1


BASE_ROW = Row("base", "", "the paper's base: N 6, d_model 512, h 8, d_k 64, dropout 0.1, sinusoidal", {}, {},
               4.92, 25.8)
ROWS = (
    Row("A h=1", "A", "1 head of d_k = d_model (constant compute)", {"n_heads": 1}, {}, 5.29, 24.9),
    Row("A h=32", "A", "32 heads of d_k = d_model / 32 (constant compute)", {"n_heads": 32}, {}, 5.01, 25.4),
    Row("B d_k/4", "B", "d_k a quarter of the base's, 8 heads (paper: d_k 16)", {"head_dim": 2}, {}, 5.16, 25.1),
    Row("C N/3", "C", "a third of the layers (paper: N = 2)", {"n_layers": 1}, {}, 6.11, 23.7),
    Row("D dropout 0", "D", "no dropout", {"dropout": 0.0}, {}, 5.77, 24.6),
    Row("E learned", "E", "learned positional embedding instead of sinusoids", {"pos": "learned"}, {}, 4.92, 25.7),
)

BASE = run_config(
    model=ModelConfig(n_layers=3, n_heads=8, d_model=64, d_ff=256, norm="pre", pos="sinusoidal", dropout=0.1),
    task=TaskConfig(name="text", min_len=32, max_len=32),
    train=TrainConfig(steps=600, batch_size=32, lr=3e-3, warmup=30, eval_every=30, label_smoothing=0.1),
)


def configs(seeds: Sequence[int] = SEEDS) -> list[RunConfig]:
    """Every run of the experiment: the base and each row, at each seed, named "<row> seed <s>"."""
    out = []
    for row in (BASE_ROW, *ROWS):
        for s in seeds:
            cfg = replace(BASE, name=f"{row.key} seed {s}", model=replace(BASE.model, **row.model),
                          train=replace(BASE.train, seed=s, **row.train))
            out.append(cfg)
    return out


@dataclass(frozen=True)
class Band:
    """A measurement over seeds: mean, min and max."""
    mean: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Band":
        return cls(sum(values) / len(values), min(values), max(values))

    def text(self) -> str:
        return f"{self.mean:.2f} [{self.lo:.2f}, {self.hi:.2f}]"


def mark(paper_sign: int, base: Band, row: Band) -> str:
    """The row's mark from the measured bands (lower is better): within the seeds' spread when the two
    [min, max] intervals overlap, else whether the row moved from the base the way the paper's did."""
    if row.lo <= base.hi and base.lo <= row.hi:
        return SPREAD
    measured_sign = 1 if row.lo > base.hi else -1
    return SAME if measured_sign == paper_sign else OPPOSITE


def perplexity(summary: Mapping[str, Any]) -> Optional[float]:
    """Held-out perplexity per character, exp(held-out loss), of a finished run's summary (None without one)."""
    loss = ((summary or {}).get("eval") or {}).get("loss")
    return math.exp(loss) if loss is not None and loss == loss else None


def table(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The experiment's view, one dict per row (the base first): the paper's perplexity and BLEU, the
    measured perplexity band over seeds, and the row's mark; `results` maps run names to summaries. A row
    with a seed missing reads "not run yet" and has no mark."""
    def band(row: Row) -> Optional[Band]:
        vals = [perplexity(results.get(f"{row.key} seed {s}", {})) for s in SEEDS]
        return Band.of([v for v in vals if v is not None]) if None not in vals else None

    base = band(BASE_ROW)
    out = []
    for row in (BASE_ROW, *ROWS):
        b = band(row)
        out.append({"row": row.key, "variation": row.what, "paper PPL": row.ppl, "paper BLEU": row.bleu,
                    "measured PPL (mean [min, max])": b.text() if b else "not run yet",
                    "mark": "" if row is BASE_ROW or b is None or base is None else mark(row.paper_sign, base, b)})
    return out
