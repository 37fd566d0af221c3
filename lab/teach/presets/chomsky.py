"""What attention cannot do: the length-generalization map of Delétang et al. 2023 at toy scale.

Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy", ICLR) trained RNNs, LSTMs, Transformers and
memory-augmented RNNs on 15 tasks at lengths 1 to 40 and scored them on lengths 41 to 500: a model that learned
a task's algorithm keeps it at longer inputs, one that fitted its training lengths does not. Their Table 2:
RNNs and LSTMs solve the regular tasks (parity, even pairs, cycle navigation, modular arithmetic) at any
length; Transformers fail even there (but for even pairs), whatever their positional encoding; no plain
network solves the context-free and context-sensitive tasks (the LSTM's bucket sort aside). Ruoss et al. 2023
lifted the Transformers with randomized positions (lab/positional.py).

Here each architecture trains on lengths 1 to 10 and is scored on 11 to 20 (the held-out longer lengths, the
`ood` split): a cell is the token accuracy there, mean over seeds with the seeds' spread, beside the paper's
number and a mark. `quick_configs` is the preset (3 tasks, 4 architectures, 2 seeds: minutes on 2 cores);
`full_configs` every row and task of the map (`python -m lab preset chomsky --full`). What the full map
measured, and where it disagrees with the paper: docs/SCIENCE.md.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from lab.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.derived import run_config
from lab.tasks.shapes import SHAPES

SOLVED = 0.9  # the paper's threshold: a score of at least 90% solves the task (their App. B.1)
TRAIN_LEN, TEST_LEN = 10, 20  # training lengths 1..10, scored at 11..20
SEEDS, QUICK_SEEDS = (0, 1, 2), (0, 1)
SAME, DIFFERENT, SPREAD, NO_PAPER = "same verdict as the paper", "different", "within the seeds' spread", ""

# Delétang et al. 2023, Table 2: the score (%) of each architecture, the per-sequence accuracy averaged over
# the test lengths 41..500 and maximised over 10 seeds and 3 learning rates; the Transformer's is the best of
# five positional encodings (none, sin/cos, RoPE, ALiBi, relative). docs/SCIENCE.md has the whole table.
PAPER: dict[str, dict[str, float]] = {
    "Parity Check": {"RNN": 100.0, "LSTM": 100.0, "Transformer": 52.0},
    "Even Pairs": {"RNN": 100.0, "LSTM": 100.0, "Transformer": 96.4},
    "Cycle Navigation": {"RNN": 100.0, "LSTM": 100.0, "Transformer": 61.9},
    "Modular Arithmetic (Simple)": {"RNN": 100.0, "LSTM": 100.0, "Transformer": 24.2},
    "Reverse String": {"RNN": 62.0, "LSTM": 60.9, "Transformer": 62.3},
    "Stack Manipulation": {"RNN": 56.0, "LSTM": 59.1, "Transformer": 57.5},
    "Modular Arithmetic": {"RNN": 41.3, "LSTM": 59.2, "Transformer": 32.5},
    "Duplicate String": {"RNN": 50.3, "LSTM": 57.6, "Transformer": 52.8},
    "Odds First": {"RNN": 51.0, "LSTM": 55.6, "Transformer": 52.8},
    "Binary Addition": {"RNN": 50.3, "LSTM": 55.5, "Transformer": 54.3},
    "Bucket Sort": {"RNN": 27.9, "LSTM": 99.3, "Transformer": 91.9},
}


@dataclass(frozen=True)
class Row:
    """An architecture of the map: its label, the model fields it changes, and the paper's column for it."""

    label: str  # "Transformer, RoPE"
    model: Mapping[str, Any]
    paper: Optional[str]  # "Transformer", "RNN", "LSTM", or None (the paper has no such column)


TRANSFORMER = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=128, pos="learned")
RECURRENT = dict(n_layers=1, n_heads=1, d_ff=0, norm="none", pos="none")  # one layer of width 64, as the paper's 256
ROWS = (
    Row("Transformer, learned", {}, "Transformer"),
    Row("Transformer, sinusoidal", {"pos": "sinusoidal"}, "Transformer"),
    Row("Transformer, RoPE", {"pos": "rope"}, "Transformer"),
    Row("Transformer, ALiBi", {"pos": "alibi"}, "Transformer"),
    Row("Transformer, no PE", {"pos": "none"}, "Transformer"),
    Row("Transformer, RoPE randomized", {"pos": "rope", "pos_range": 64}, None),  # Ruoss et al. 2023
    Row("RNN", {"arch": "rnn", **RECURRENT}, "RNN"),
    Row("LSTM", {"arch": "lstm", **RECURRENT}, "LSTM"),
    Row("GRU", {"arch": "gru", **RECURRENT}, None),
)
ROW = {r.label: r for r in ROWS}
# the tasks of the map by class (lab/tasks/shapes.py: each shape's `chomsky` and `paper_task`)
TASKS = ("parity", "even_pairs", "cycle_navigation", "modular_arithmetic", "reverse", "stack_manipulation",
         "modular_arithmetic_brackets", "copy", "odds_first", "binary_addition", "sort")
QUICK_ROWS = ("Transformer, learned", "Transformer, RoPE randomized", "RNN", "LSTM")
QUICK_TASKS = ("parity", "even_pairs", "reverse")
SYMBOLS = {"copy": 2, "reverse": 2, "sort": 5}  # the paper's alphabets: bits, and 5 symbols to sort
TRAIN = TrainConfig(steps=1000, batch_size=64, lr=3e-3, warmup=50, eval_every=50, eval_samples=256, snapshots=0)


def run_name(row: str, task: str, seed: int) -> str:
    return f"{row} | {task} | seed {seed}"


def config(row: str, task: str, seed: int) -> RunConfig:
    """One cell's run at one seed: the row's model on the task's lengths 1..10, scored up to 20."""
    model = replace(TRANSFORMER, **ROW[row].model)
    lo = 3 if task == "binary_addition" else 1  # a bit, '+', a bit
    extra = {"n_symbols": SYMBOLS[task]} if task in SYMBOLS else {}
    tc = TaskConfig(name=task, min_len=lo, max_len=TRAIN_LEN, ood_len=TEST_LEN, **extra)
    return run_config(model, tc, replace(TRAIN, seed=seed), name=run_name(row, task, seed))


def configs(rows: Sequence[str], tasks: Sequence[str], seeds: Sequence[int]) -> list[RunConfig]:
    return [config(r, t, s) for t in tasks for r in rows for s in seeds]


def quick_configs() -> list[RunConfig]:
    """The preset: parity and even pairs (regular), reverse (context-free); 4 architectures, 2 seeds."""
    return configs(QUICK_ROWS, QUICK_TASKS, QUICK_SEEDS)


def full_configs() -> list[RunConfig]:
    """The whole map: every row, every task, 3 seeds (297 runs), each evaluated at its end only (the map reads the
    final numbers; 20 evaluations on the way would take about as long as the training)."""
    return [replace(c, train=replace(c.train, eval_every=c.train.steps))
            for c in configs([r.label for r in ROWS], TASKS, SEEDS)]


@dataclass(frozen=True)
class Cell:
    """A measured cell: the token accuracy at the longer lengths of each seed's run."""

    row: str
    task: str
    accs: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.accs) / len(self.accs)

    @property
    def paper(self) -> Optional[float]:
        """The paper's score (%) for this cell, where it has one."""
        column = ROW[self.row].paper
        return PAPER.get(SHAPES[self.task].paper_task, {}).get(column) if column else None

    @property
    def mark(self) -> str:
        """Against the paper's verdict (solved: a score of at least 90%): the seeds disagree among themselves
        (some at or above 0.9, some below), or the mean's verdict is the paper's or not."""
        if self.paper is None:
            return NO_PAPER
        if min(self.accs) < SOLVED <= max(self.accs):
            return SPREAD
        return SAME if (self.mean >= SOLVED) == (self.paper >= 100 * SOLVED) else DIFFERENT

    def text(self) -> str:
        spread = f" [{100 * min(self.accs):.0f}-{100 * max(self.accs):.0f}]" if len(self.accs) > 1 else ""
        return f"{100 * self.mean:.0f}%{spread}"


def ood_accuracy(summary: Mapping[str, Any]) -> Optional[float]:
    """A finished run's token accuracy at the held-out longer lengths (None without one)."""
    v = ((summary or {}).get("ood") or {}).get("token_acc")
    return float(v) if v is not None and v == v else None


def cells(results: Mapping[str, Mapping[str, Any]], rows: Sequence[str], tasks: Sequence[str],
          seeds: Sequence[int]) -> dict[tuple[str, str], Cell]:
    """The measured cells whose every seed has a result (`results`: run name -> summary)."""
    out = {}
    for t in tasks:
        for r in rows:
            accs = [ood_accuracy(results.get(run_name(r, t, s), {})) for s in seeds]
            if None not in accs:
                out[(r, t)] = Cell(r, t, tuple(accs))  # type: ignore[arg-type]
    return out


def layout(results: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[str], list[int]]:
    """The rows, tasks and seeds present in `results` (the quick preset's, the full map's or a part of it)."""
    parsed = [n.split(" | ") for n in results if n.count(" | ") == 2]
    rows = [r.label for r in ROWS if any(p[0] == r.label for p in parsed)]
    tasks = [t for t in TASKS if any(p[1] == t for p in parsed)]
    seeds = sorted({int(p[2].removeprefix("seed ")) for p in parsed})
    return rows, tasks, seeds


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The map as a markdown table: a row per architecture, a column per task (grouped by class), each cell
    the measured accuracy at the longer lengths (mean [min, max] over seeds), the paper's score and the mark."""
    rows, tasks, seeds = layout(results)
    return _table(cells(results, rows, tasks, seeds), rows, tasks, len(seeds))


def _table(got: Mapping[tuple[str, str], Cell], rows: Sequence[str], tasks: Sequence[str], n_seeds: int) -> str:
    symbol = {SAME: "✓", DIFFERENT: "✗", SPREAD: "~", NO_PAPER: ""}
    head = ["Architecture"] + [f"{t} ({SHAPES[t].chomsky})" for t in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out = [r]
        for t in tasks:
            c = got.get((r, t))
            if c is None:
                out.append("not run yet")
                continue
            paper = f"paper {c.paper:.0f}% {symbol[c.mark]}" if c.paper is not None else "paper: none"
            out.append(f"{c.text()}<br>{paper}")
        lines.append("| " + " | ".join(out) + " |")
    legend = (f"Each cell: token accuracy at lengths {TRAIN_LEN + 1}-{TEST_LEN}, mean [min, max] over {n_seeds} "
              "seeds, and the paper's score: ✓ the same verdict (solved at 90%), ✗ a different one, ~ the seeds "
              "disagree.")
    return "\n".join(lines) + "\n\n" + legend


def explain(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The headline from the measured cells (the first sentence: projector mode shows it), then the map."""
    rows, tasks, seeds = layout(results)
    got = cells(results, rows, tasks, seeds)
    recurrent = [c for c in got.values() if ROW[c.row].paper in ("RNN", "LSTM") and SHAPES[c.task].chomsky == "R"]
    attention = [c for c in got.values() if c.row.startswith("Transformer") and SHAPES[c.task].chomsky == "R"]
    harder = [c for c in got.values() if SHAPES[c.task].chomsky != "R"]
    parts = []
    if recurrent and attention:
        rec_lo, att_hi = min(c.mean for c in recurrent), max(c.mean for c in attention)
        regular = ", ".join(sorted({c.task for c in recurrent}))
        if rec_lo >= SOLVED > att_hi:
            kept = f"{100 * rec_lo:.0f}%" + (" or better" if rec_lo < 1 else "")
            parts.append(f"Trained on lengths 1-{TRAIN_LEN} and tested on {TRAIN_LEN + 1}-{TEST_LEN}, the recurrent "
                         f"models kept the regular tasks ({regular}) at {kept} while every Transformer stayed at "
                         f"{100 * att_hi:.0f}% or below on average: recurrence generalizes where attention does not, "
                         "as Delétang et al. 2023 found.")
        else:
            parts.append(f"On the regular tasks ({regular}) at lengths {TRAIN_LEN + 1}-{TEST_LEN}, the recurrent "
                         f"models reached at least {100 * rec_lo:.0f}% and the Transformers at most "
                         f"{100 * att_hi:.0f}%: this time the split was not as clean as the paper's (a score of 90% "
                         "or more solves a task).")
    if harder:
        best = max(harder, key=lambda c: c.mean)
        solved = [c for c in harder if c.mean >= SOLVED]
        parts.append(("No architecture solved a context-free or context-sensitive task at the longer lengths "
                      f"(best: {best.row} on {best.task}, {100 * best.mean:.0f}%), as in the paper."
                      if not solved else
                      f"{', '.join(f'{c.row} on {c.task}' for c in solved)} reached 90% on a task beyond the "
                      "regular ones, which the paper found for no plain network but the LSTM on bucket sort."))
    lucky = [(c, max(c.accs)) for c in attention if max(c.accs) >= SOLVED]
    if lucky:
        c, best = max(lucky, key=lambda x: x[1])
        why = (" with randomized positions, the effect Ruoss et al. 2023 report" if ROW[c.row].model.get("pos_range")
               else "")
        parts.append(f"One seed of the {c.row} reached {100 * best:.0f}% on {c.task}{why}; not every seed did.")
    differ = [c for c in got.values() if c.mark == DIFFERENT]
    if differ:
        listed = "; ".join(f"{c.row} on {c.task}: {100 * c.mean:.0f}% here, {c.paper:.0f}% in the paper" for c in differ)
        parts.append(f"Where the verdict differs ({listed}), the paper's number is a best case: the best of 10 seeds "
                     "and 3 learning rates (for a Transformer, of 5 positional encodings too) after 1M steps on "
                     f"lengths up to 40; each cell here is one encoding's mean after {TRAIN.steps} steps on lengths up "
                     f"to {TRAIN_LEN}, with smaller models.")
    marks = [c.mark for c in got.values() if c.mark]
    if marks:
        parts.append(f"Of {len(marks)} cells with a paper number, {marks.count(SAME)} give the paper's verdict, "
                     f"{marks.count(DIFFERENT)} a different one and {marks.count(SPREAD)} depend on the seed "
                     "(docs/SCIENCE.md says where the toy map differs from the paper's).")
    return (" ".join(parts) + "\n\n" + _table(got, rows, tasks, len(seeds)) + "\n\nEach cell's accuracy at every "
            "length, training lengths and longer ones: *Accuracy by input length*, below the curves.")
