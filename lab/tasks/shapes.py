"""The shape of each toy task: alphabet, prompt and answer lengths, which lengths are trained and
evaluated, and which architectures can run it. Plain arithmetic, no torch, so a config can check that its
longest sequence fits the model (lab/config.py) and limits and time estimates can size a run before
anything is built.

This module is the one registry of tasks: a task is declared by its shape class here, with its name, and
listed once in SHAPES; the task names everywhere (lab/config.py's task.name choices, the app's dropdown,
the command line) are SHAPES' keys. Its batch generator in lab/tasks/batches.py names the task it generates
(`class Copy(Task, task="copy")`) and holds this shape (`Task.shape`) rather than repeating it.

Decoder-only models read `prompt SEP answer` (scored on the answer only, minGPT's convention); an
encoder-decoder reads the prompt in the encoder and `SEP answer[:-1]` in the decoder. Language-model
tasks (induction, text) score positions of one sequence and run on the decoder only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol

import lab.textdata as textdata
from lab.fields import ConfigError
from lab.records import EXACT_MATCH, LOSS, PREDICTABLE_ACC, TOKEN_ACC, Metric


class TaskConfig(Protocol):
    """What a shape reads of a task config (lab/config.py's TaskConfig, which imports this module)."""

    name: str
    min_len: int
    max_len: int
    n_symbols: int
    modulus: int
    train_fraction: float
    text: str

    @property
    def ood_max_len(self) -> int: ...

IGNORE_INDEX = -100  # target value of positions left out of the loss (minGPT's convention)


class TaskShape:
    """A sequence-to-sequence task's sizes; subclasses override what differs."""

    name = ""
    description = ""
    lm = False  # language-model tasks score positions of one sequence (decoder only)
    has_ood = True  # does a longer-than-training evaluation make sense?
    headline: tuple[Metric, ...] = (EXACT_MATCH, TOKEN_ACC, LOSS)  # see headline_metrics
    # training lengths (min_len, max_len) a config of this task starts from; None: the fields' defaults (1, 8)
    default_lengths: Optional[tuple[int, int]] = None
    # the task config fields (besides name) this task reads; the app hides the others while it is chosen
    reads: frozenset[str] = frozenset({"min_len", "max_len", "ood_len", "n_symbols"})
    # its class in Delétang et al. 2023 (Table 1: "R" regular, "DCF" deterministic context-free, "CS"
    # context-sensitive) and the paper's name for it, where the paper has the task; docs/SCIENCE.md says why
    chomsky: Optional[str] = None
    paper_task: str = ""

    def n_symbols(self, cfg: TaskConfig) -> int:
        return cfg.n_symbols

    def prompt_symbols(self, cfg: TaskConfig) -> int:
        """How many token ids, from 0, a prompt may hold (the rest of the symbols are answers only)."""
        return self.n_symbols(cfg)

    def check_prompt(self, cfg: TaskConfig, tokens: list[int]) -> Optional[str]:
        """Why a typed prompt (token ids, each a prompt symbol) is not an input of this task, or None."""
        return None

    def prompt_len(self, cfg: TaskConfig, length: int) -> int:
        return length

    def answer_len(self, cfg: TaskConfig, length: int) -> int:
        return length

    def symbol_label(self, cfg: TaskConfig, tok: int) -> str:
        return str(tok)

    def vocab_size(self, cfg: TaskConfig) -> int:
        return self.n_symbols(cfg) + 1  # + SEP

    def sep(self, cfg: TaskConfig) -> int:
        return self.n_symbols(cfg)

    def label(self, cfg: TaskConfig, tok: int) -> str:
        return "|" if tok == self.sep(cfg) else self.symbol_label(cfg, tok)

    def check(self, cfg: TaskConfig, arch: str) -> None:
        """Raise ConfigError if the task cannot run with this architecture."""

    def encode_prompt(self, cfg: TaskConfig, text: str) -> Optional[list[int]]:
        """A typed prompt as token ids, for tasks that read text as it is typed (`text`: character by
        character); None for the others, whose prompts are symbols separated by spaces or commas."""
        return None

    def decode(self, cfg: TaskConfig, tokens: list[int]) -> Optional[str]:
        """Token ids as the text they stand for, for tasks whose prompts are typed text (the inverse of
        `encode_prompt`); None for the others, whose tokens read as labels."""
        return None

    def unigram(self, cfg: TaskConfig) -> Optional[float]:
        """The loss (nats) of the best model that ignores context, where it differs from chance (the text
        task: its training characters' entropy); None elsewhere (see LossBaselines)."""
        return None

    def max_seq_len(self, cfg: TaskConfig, arch: str) -> int:
        """The longest sequence a model sees, evaluation beyond the training lengths included."""
        self.check(cfg, arch)
        n = cfg.ood_max_len if self.has_ood else cfg.max_len
        p, a = self.prompt_len(cfg, n), self.answer_len(cfg, n)
        return max(p, a) if arch == "encoder-decoder" else p + a

    def lengths(self, cfg: TaskConfig, split: str) -> list[int]:
        """Task lengths of a split: "train" and "eval" the training range, "ood" the longer ones."""
        if split == "ood":
            return list(range(cfg.max_len + 1, cfg.ood_max_len + 1)) if self.has_ood else []
        return list(range(cfg.min_len, cfg.max_len + 1))


class Copy(TaskShape):
    name, description = "copy", "Repeat the input sequence."
    # prompt SEP answer is w|w: the language {w#w} is context-sensitive (the paper's Duplicate String writes ww)
    chomsky, paper_task = "CS", "Duplicate String"


class Reverse(TaskShape):
    name, description = "reverse", "Write the input backwards."
    chomsky, paper_task = "DCF", "Reverse String"  # w#w^R: a stack suffices


class Sort(TaskShape):
    name, description = "sort", "Sort the symbols in ascending order (half the samples with many repeats)."
    chomsky, paper_task = "CS", "Bucket Sort"


class Addition(TaskShape):
    """a + b with `length` digits each; answer digits reversed, least significant first (minGPT adder)."""

    name, description = "addition", "Add two numbers; the answer is written least-significant digit first."
    reads = frozenset({"min_len", "max_len", "ood_len"})  # digits and '+': no alphabet size

    def n_symbols(self, cfg):
        return 11  # digits and '+'

    def prompt_len(self, cfg, length):
        return 2 * length + 1

    def answer_len(self, cfg, length):
        return length + 1

    def symbol_label(self, cfg, tok):
        return "+" if tok == 10 else str(tok)

    def check_prompt(self, cfg, tokens):
        n = len(tokens)
        if n % 2 == 0 or tokens.count(10) != 1 or tokens[n // 2] != 10:
            return "addition needs two numbers of equal length joined by '+', e.g. 123+456"
        return None


class ModularAddition(TaskShape):
    """(a + b) mod p from the tokens `a b =`, scored at `=` only (Power et al. 2022, grokking)."""

    name, description = "modular_addition", "Compute (a + b) mod p; most pairs are held out (grokking)."
    has_ood = False
    headline = (EXACT_MATCH, LOSS)  # one answer token: token accuracy is exact-match
    reads = frozenset({"modulus", "train_fraction"})  # always `a b =`: no lengths, the alphabet is 0..p-1

    def n_symbols(self, cfg):
        return cfg.modulus

    def prompt_len(self, cfg, length):
        return 2

    def answer_len(self, cfg, length):
        return 1

    def lengths(self, cfg, split):
        return [] if split == "ood" else [2]

    def label(self, cfg, tok):
        return "=" if tok == self.sep(cfg) else str(tok)

    def check_prompt(self, cfg, tokens):
        return None if len(tokens) == 2 else f"has {len(tokens)} symbols (allowed: exactly 2, e.g. '5 7')"


class Parity(TaskShape):
    name, description = "parity", "Is the number of 1s odd? One answer token."
    headline = (EXACT_MATCH, LOSS)
    reads = frozenset({"min_len", "max_len", "ood_len"})  # bits: no alphabet size
    chomsky, paper_task = "R", "Parity Check"

    def n_symbols(self, cfg):
        return 2

    def answer_len(self, cfg, length):
        return 1


# ---- the other tasks of Delétang et al. 2023 (lab/tasks/chomsky.py generates them) ----------------------------
class Labelled(TaskShape):
    """A task with a fixed alphabet of named symbols (`symbols`), the first `inputs` of which a prompt holds;
    no alphabet size to set."""

    symbols: tuple[str, ...] = ()
    inputs = 0
    reads = frozenset({"min_len", "max_len", "ood_len"})

    def n_symbols(self, cfg):
        return len(self.symbols)

    def prompt_symbols(self, cfg):
        return self.inputs

    def symbol_label(self, cfg, tok):
        return self.symbols[tok]


class EvenPairs(Labelled):
    """A string of a and b: is the number of 'ab' and 'ba' pairs even? (It is iff the first and the last
    symbol agree: a finite automaton with 4 states decides it.)"""

    name, description = "even_pairs", "Is the number of ab and ba pairs even? One answer token."
    chomsky, paper_task = "R", "Even Pairs"
    headline = (EXACT_MATCH, LOSS)
    symbols, inputs = ("a", "b", "even", "odd"), 2

    def answer_len(self, cfg, length):
        return 1


class CycleNavigation(Labelled):
    """Moves on a cycle of 5 positions from position 0: stay, +1 or -1; where does it end?"""

    name, description = "cycle_navigation", "Walk a cycle of 5 (stay, +1, -1) from 0; where do you end?"
    chomsky, paper_task = "R", "Cycle Navigation"
    headline = (EXACT_MATCH, LOSS)
    symbols, inputs = ("0", "+1", "-1", "@0", "@1", "@2", "@3", "@4"), 3

    def answer_len(self, cfg, length):
        return 1


class ModularArithmetic(Labelled):
    """`length` numbers 0-4 joined by +, - and * (usual precedence), reduced mod 5: the paper's simple
    modular arithmetic, with `length` counting the numbers (the paper counts tokens, 2 length - 1 here)."""

    name, description = "modular_arithmetic", "Compute 1+2*3-4 ... mod 5 (* before + and -). One answer token."
    chomsky, paper_task = "R", "Modular Arithmetic (Simple)"
    headline = (EXACT_MATCH, LOSS)
    symbols, inputs = ("0", "1", "2", "3", "4", "+", "-", "*"), 8

    def prompt_len(self, cfg, length):
        return 2 * length - 1

    def answer_len(self, cfg, length):
        return 1

    def check_prompt(self, cfg, tokens):
        ok = len(tokens) % 2 == 1 and all((t < 5) == (i % 2 == 0) for i, t in enumerate(tokens))
        return None if ok else "needs numbers 0-4 and operators + - * taking turns, e.g. 1+2*3"


class StackManipulation(Labelled):
    """A stack's content (a and b, bottom first), then actions (pop, +a: push a, +b: push b; a pop of an empty
    stack does nothing); the answer is the final stack, top first, then 'end', padded with '_' to length + 1
    tokens. Positions after 'end' are not scored (the paper's accuracy mask)."""

    name, description = "stack_manipulation", "Apply pop / push to a stack; write the final stack, top first."
    chomsky, paper_task = "DCF", "Stack Manipulation"
    symbols, inputs = ("a", "b", "pop", "+a", "+b", "end", "_"), 5

    def answer_len(self, cfg, length):
        return length + 1


class ModularArithmeticBrackets(Labelled):
    """An expression of exactly `length` tokens over 0-4, +, -, * and brackets, reduced mod 5, from the
    paper's grammar: d, -d, (d), (-d), and for 5 tokens or more (left op right)."""

    name, description = "modular_arithmetic_brackets", "Compute a bracketed expression like (1-(2*3)) mod 5."
    chomsky, paper_task = "DCF", "Modular Arithmetic"
    headline = (EXACT_MATCH, LOSS)
    symbols, inputs = ("0", "1", "2", "3", "4", "+", "-", "*", "(", ")"), 10

    def answer_len(self, cfg, length):
        return 1


class OddsFirst(Labelled):
    """A string of a and b; the answer is its symbols at odd positions (1st, 3rd, ...), then those at even ones."""

    name, description = "odds_first", "Write the 1st, 3rd, 5th ... symbols, then the 2nd, 4th ..."
    chomsky, paper_task = "CS", "Odds First"
    symbols, inputs = ("a", "b"), 2


class BinaryAddition(Labelled):
    """Two binary numbers, least significant bit first, `x + y` in `length` tokens; the answer is their sum,
    least significant bit first and without leading zeros, then 'end', padded with '_' to length + 1 tokens
    (positions after 'end' are not scored). At least 3 tokens: a bit, '+', a bit."""

    name, description = "binary_addition", "Add two binary numbers (least significant bit first)."
    chomsky, paper_task = "CS", "Binary Addition"
    symbols, inputs = ("0", "1", "+", "end", "_"), 3
    default_lengths = (3, 8)
    LONGEST = 60  # the sums are int64 (lab/tasks/chomsky.py)

    def answer_len(self, cfg, length):
        return length + 1

    def check(self, cfg, arch):
        if cfg.min_len < 3:
            raise ConfigError("task.min_len", f"{cfg.min_len} is too short for 'binary_addition' (allowed: >= 3: "
                              "a bit, '+', a bit)")
        if cfg.ood_max_len > self.LONGEST:
            raise ConfigError("task.ood_len", f"{cfg.ood_max_len} is too long for 'binary_addition' (allowed: "
                              f"lengths up to {self.LONGEST})")

    def check_prompt(self, cfg, tokens):
        if tokens.count(2) != 1 or tokens[0] == 2 or tokens[-1] == 2:
            return "needs two binary numbers joined by one '+', least significant bit first, e.g. 011+1"
        return None


class Histogram(TaskShape):
    """For each input symbol, how often it occurs in the input (Weiss et al. 2021, RASP)."""

    name, description = "histogram", "For each symbol, count how often it appears in the input."

    def vocab_size(self, cfg):
        return cfg.n_symbols + cfg.ood_max_len + 1  # symbols, counts 1..max, SEP

    def sep(self, cfg):
        return cfg.n_symbols + cfg.ood_max_len

    def symbol_label(self, cfg, tok):
        return str(tok) if tok < cfg.n_symbols else f"#{tok - cfg.n_symbols + 1}"


class Induction(TaskShape):
    """Random tokens, then a random segment repeated periodically from a random offset (Olsson et al. 2022)."""

    name, description = "induction", "Continue a repeated random segment (needs an induction head)."
    lm = True
    headline = (LOSS, PREDICTABLE_ACC)  # exact-match needs the unpredictable first repeated token too
    default_lengths = (8, 16)  # the fields' 1-8 is too short: a repeat needs room (min_len >= 4)

    def check(self, cfg, arch):
        if arch == "encoder-decoder":
            raise ConfigError("task.name", "'induction' is a language-model task: it needs one sequence "
                              "(model.arch 'decoder', 'rnn', 'lstm' or 'gru')")
        if cfg.min_len < 4:
            raise ConfigError("task.min_len", f"{cfg.min_len} is too short for 'induction' (allowed: >= 4)")

    def vocab_size(self, cfg):
        return cfg.n_symbols

    def sep(self, cfg):
        return -1

    def max_seq_len(self, cfg, arch):
        self.check(cfg, arch)
        return cfg.ood_max_len - 1


class Text(TaskShape):
    """A character-level language model of the user's text, or of the built-in one (lab/textdata.py).

    Its token ids are the text's distinct characters, sorted; a sequence of `length` characters is read
    as `length - 1` inputs, each scored on the next character, as induction's sequences are. Windows of
    the first 90% train, windows of the last 10% are held out; no longer lengths are evaluated.
    """

    name = "text"
    description = "Continue your text, one character at a time (empty box: the built-in text)."
    lm = True
    has_ood = False
    headline = (LOSS,)  # against loss_baselines: no window of a real text is predicted exactly
    default_lengths = (16, 16)  # windows of 16 characters: at least 2, and within the held-out tenth of any
    # valid text (200 characters or more: 20 held out)
    reads = frozenset({"min_len", "max_len", "text"})  # its alphabet is the text's characters

    def chars(self, cfg: TaskConfig) -> tuple[str, ...]:
        """The vocabulary: token id i is the character `chars(cfg)[i]`."""
        return textdata.vocabulary(textdata.text_of(cfg.text))

    def n_symbols(self, cfg):
        return len(self.chars(cfg))

    def vocab_size(self, cfg):
        return self.n_symbols(cfg)

    def sep(self, cfg):
        return -1

    def symbol_label(self, cfg, tok):
        return textdata.char_label(self.chars(cfg)[tok])

    def encode_prompt(self, cfg, text):
        return textdata.encode(text, self.chars(cfg))

    def decode(self, cfg: TaskConfig, tokens: list[int]) -> str:
        """Token ids -> the characters they stand for (the inverse of `encode_prompt`)."""
        return textdata.decode(tokens, self.chars(cfg))

    def unigram(self, cfg):
        return textdata.training_unigram_entropy(textdata.text_of(cfg.text))

    def check(self, cfg, arch):
        if arch == "encoder-decoder":
            raise ConfigError("task.name", "'text' is a language-model task: it needs one sequence "
                              "(model.arch 'decoder', 'rnn', 'lstm' or 'gru')")
        if cfg.min_len < 2:
            raise ConfigError("task.min_len", f"{cfg.min_len} is too short for 'text' (allowed: >= 2: a "
                              "character and the next one)")
        held = textdata.held_out_len(textdata.text_of(cfg.text))
        if cfg.max_len > held:
            raise ConfigError("task.max_len", f"{cfg.max_len} is longer than the held-out tenth of the text "
                              f"({held} characters) (allowed: at most {held}, or a longer text)")

    def max_seq_len(self, cfg, arch):
        self.check(cfg, arch)
        return cfg.max_len - 1


# The registry: every task, once, in the order the app and the command line list them.
SHAPES: dict[str, TaskShape] = {
    s.name: s for s in (Copy(), Reverse(), Sort(), Addition(), ModularAddition(), Induction(), Parity(), Histogram(),
                        Text(), EvenPairs(), CycleNavigation(), ModularArithmetic(), StackManipulation(),
                        ModularArithmeticBrackets(), OddsFirst(), BinaryAddition())
}
TASK_NAMES: tuple[str, ...] = tuple(SHAPES)  # task.name's allowed values (lab/config.py)


def task_shape(name: str) -> TaskShape:
    return SHAPES[name]


def readers(field: str) -> tuple[str, ...]:
    """The tasks that read task config field `field` ("n_symbols"), in registry order (the field's help
    names them; the app hides the field for the others)."""
    return tuple(name for name, shape in SHAPES.items() if field in shape.reads)


def headline_metrics(name: str) -> tuple[Metric, ...]:
    """The evaluation metrics that mean something for task `name`, most telling first, as EvalRecord
    columns of the held-out set at the training lengths (lab/records.py Metric: loss, token_acc, exact_match,
    predictable_acc); "train_" before one names the same measure on the training distribution, "ood_"
    before loss, token_acc or exact_match the held-out longer lengths. Sequence tasks: exact-match (a
    sequence right as a whole); one-token answers (modular addition, parity): exact-match and loss;
    induction: loss and the accuracy on the predictable positions (its exact-match counts the unpredictable
    first repeated token too, so it stays near chance for a model that copies every later token, Olsson
    et al. 2022); text: loss only, read against `loss_baselines` (a language model of real text is never
    right on a whole window)."""
    return SHAPES[name].headline


@dataclass(frozen=True)
class LossBaselines:
    """What a model's loss (nats a scored token) is read against: `chance`, ln of the vocabulary size (the
    loss of a uniform guess), and for the text task `unigram`, the entropy of the training text's character
    frequencies (the loss of the best model that ignores context, Shannon 1951); None elsewhere (induction's
    tokens are uniform, so its unigram loss is chance)."""

    chance: float
    unigram: Optional[float] = None


def loss_baselines(cfg: TaskConfig) -> LossBaselines:
    """The loss baselines of a task config, in nats (see LossBaselines)."""
    shape = SHAPES[cfg.name]
    return LossBaselines(math.log(shape.vocab_size(cfg)), shape.unigram(cfg))
