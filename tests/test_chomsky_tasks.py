"""The tasks of Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy"; lab/tasks/chomsky.py): the
paper's worked examples, its classes, its generators' distributions, and typed prompts. Their answers against a
plain Python reference at every length, their layouts and their length splits are checked with every other
task's in tests/test_tasks.py."""
from __future__ import annotations

import pytest
import torch

from lab.config import ConfigError, ModelConfig, RunConfig, TaskConfig
from lab.tasks.batches import get_task
from lab.tasks.shapes import SHAPES
from lab.views.analysis import parse_probe

pytestmark = pytest.mark.usefixtures("one_thread")


def tokens(name: str, text: str) -> torch.Tensor:
    """A prompt written with the task's labels, separated by spaces -> (1, n) token ids."""
    task, cfg = get_task(name), TaskConfig(name=name, min_len=3, max_len=8)
    ids = {task.label(cfg, t): t for t in range(task.n_symbols(cfg))}
    return torch.tensor([[ids[w] for w in text.split()]])


def answer(name: str, text: str) -> str:
    task, cfg = get_task(name), TaskConfig(name=name, min_len=3, max_len=8)
    return " ".join(task.label(cfg, t) for t in task.solve(cfg, tokens(name, text))[0].tolist())


def test_the_papers_worked_examples():
    assert answer("modular_arithmetic", "1 + 2 * 3") == "2"  # the code's docstring: * before +
    assert answer("modular_arithmetic", "1 - 1 - 1") == "4"
    assert answer("modular_arithmetic", "0 * 1 + 4 * 3 - 2") == "0"
    assert answer("odds_first", "a a a b a a") == "a a a a b a"  # the paper's aaabaa -> aaaaba
    assert answer("even_pairs", "a a b b a") == "even"  # ab, ba: 2 pairs
    assert answer("even_pairs", "a b b b") == "odd"
    assert answer("cycle_navigation", "+1 +1 -1 0 -1 -1") == "@4"  # 1 + 1 - 1 - 1 - 1 = -1 = 4 mod 5
    assert answer("stack_manipulation", "a b +a pop pop +b") == "b a end _ _ _ _"  # the paper's example shape
    assert answer("stack_manipulation", "a pop pop pop") == "end _ _ _ _"  # popping an empty stack does nothing
    assert answer("modular_arithmetic_brackets", "( ( - 3 ) * ( 2 + 4 ) )") == "2"  # -18 mod 5
    assert answer("binary_addition", "1 1 + 1") == "0 0 1 end _"  # 3 + 1 = 4, least significant bit first


def test_every_task_of_the_paper_here_has_its_class():
    classes = {name: (s.chomsky, s.paper_task) for name, s in SHAPES.items() if s.chomsky}
    assert {n for n, (c, _) in classes.items() if c == "R"} == {"parity", "even_pairs", "cycle_navigation",
                                                                 "modular_arithmetic"}
    assert {n for n, (c, _) in classes.items() if c == "DCF"} == {"reverse", "stack_manipulation",
                                                                   "modular_arithmetic_brackets"}
    assert {n for n, (c, _) in classes.items() if c == "CS"} == {"copy", "sort", "odds_first", "binary_addition"}
    assert classes["copy"][1] == "Duplicate String" and classes["sort"][1] == "Bucket Sort"


def test_the_generators_draw_what_the_paper_draws():
    gen = torch.Generator().manual_seed(0)
    cfg = TaskConfig(name="binary_addition", min_len=3, max_len=9)
    prompt = get_task("binary_addition").gen_prompt(cfg, 9, 4000, gen, "train")  # (4000, 9)
    split = (prompt == 2).long().argmax(1)
    assert set(split.tolist()) == set(range(1, 8))  # x has 1 .. 7 bits, y the rest
    first = prompt[split == 1, 0]
    assert (first == 1).all()  # a one-bit x is 1: numbers are never 0
    cfg = TaskConfig(name="stack_manipulation", min_len=1, max_len=9)
    prompt = get_task("stack_manipulation").gen_prompt(cfg, 9, 4000, gen, "train")
    stack = (prompt >= 2).long().argmax(1)  # the first action: the initial stack's size
    assert set(stack.tolist()) == set(range(1, 9)) and (prompt[:, 0] < 2).all()
    cfg = TaskConfig(name="modular_arithmetic_brackets", min_len=1, max_len=9)
    prompt = get_task("modular_arithmetic_brackets").gen_prompt(cfg, 9, 500, gen, "train")
    seen = {t for row in prompt.tolist() for t in row}
    assert seen == set(range(10))  # every digit, operator and bracket occurs
    assert all(row[0] == 8 and row[-1] == 9 for row in prompt.tolist())  # 5 tokens or more: (left op right)


def test_typed_prompts_are_inputs_of_the_task_or_refused_naming_the_probe():
    def cfg(name: str, **kw) -> RunConfig:
        return RunConfig(model=ModelConfig(n_ctx=64), task=TaskConfig(name=name, min_len=3, max_len=8, **kw))

    shown = parse_probe(cfg("modular_arithmetic"), "1 + 2 * 3")
    assert shown.batch.tgt[0, -1].item() == 2
    assert parse_probe(cfg("binary_addition"), "1 1 + 1").batch.inp.shape == (1, 9)  # 4 + SEP + 5 - 1
    for name, text, words in (("modular_arithmetic", "1 2 +", "taking turns"),
                              ("binary_addition", "1 1 1", "joined by one"), ("binary_addition", "+ 1", "joined by one"),
                              ("even_pairs", "a b even", "'even' is not a symbol"),
                              ("cycle_navigation", "+1 @3", "'@3' is not a symbol"),
                              ("addition", "12+3", "equal length"), ("modular_addition", "1 2 3", "exactly 2")):
        with pytest.raises(ConfigError, match=words) as err:
            parse_probe(cfg(name), text)
        assert err.value.field == "probe"


def test_binary_addition_refuses_lengths_it_cannot_hold_naming_the_field():
    with pytest.raises(ConfigError, match="task.min_len: 2 is too short for 'binary_addition'"):
        RunConfig(task=TaskConfig(name="binary_addition", min_len=2, max_len=8))
    with pytest.raises(ConfigError, match="task.ood_len: 70 is too long"):
        RunConfig(model=ModelConfig(n_ctx=256), task=TaskConfig(name="binary_addition", min_len=3, max_len=8,
                                                                ood_len=70))
