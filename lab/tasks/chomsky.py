"""The generators of the tasks Delétang et al. 2023 ("Neural Networks and the Chomsky Hierarchy", ICLR) add to
the lab's own (parity, reverse, copy as Duplicate String, sort as Bucket Sort), one per class of their
Table 1: regular (even pairs, cycle navigation, modular arithmetic), deterministic context-free (stack
manipulation, modular arithmetic with brackets) and context-sensitive (odds first, binary addition). Their
shapes, alphabets and the paper's names are in lab/tasks/shapes.py; the definitions follow the paper and its
code (github.com/google-deepmind/neural_networks_chomsky_hierarchy), and docs/SCIENCE.md says where the lab
differs. Every draw comes from the batch's torch generator, so a seed repeats a batch exactly.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lab.tasks.generator import Task

MODULUS = 5  # the paper's modular tasks and cycle
PLUS, MINUS, TIMES, OPEN, CLOSE = 5, 6, 7, 8, 9  # operator tokens after the digits 0-4


def _bits(length: int, n: int, gen: torch.Generator) -> Tensor:
    return torch.randint(0, 2, (n, length), generator=gen, device=gen.device)  # (n, length)


class EvenPairs(Task, task="even_pairs"):
    """Answer 'even' (2) when the string has an even number of unequal neighbours (ab or ba), else 'odd' (3)."""

    def gen_prompt(self, cfg, length, n, gen, split):
        return _bits(length, n, gen)

    def solve(self, cfg, prompt):
        unequal = (prompt[:, 1:] != prompt[:, :-1]).sum(1, keepdim=True)  # (n, 1)
        return 2 + unequal % 2


class CycleNavigation(Task, task="cycle_navigation"):
    """Actions 0 stay, 1 +1, 2 -1 from position 0 of a 5-cycle; the answer is the token of the end position."""

    def gen_prompt(self, cfg, length, n, gen, split):
        return torch.randint(0, 3, (n, length), generator=gen, device=gen.device)

    def solve(self, cfg, prompt):
        steps = torch.where(prompt == 2, -1, prompt)  # (n, L): 0, +1, -1
        return 3 + steps.sum(1, keepdim=True) % MODULUS


class ModularArithmetic(Task, task="modular_arithmetic"):
    """`length` digits 0-4 with an operator (+ - *) between each two, evaluated with * first, mod 5."""

    def gen_prompt(self, cfg, length, n, gen, split):
        out = torch.empty(n, 2 * length - 1, dtype=torch.long, device=gen.device)
        out[:, 0::2] = torch.randint(0, MODULUS, (n, length), generator=gen, device=gen.device)
        out[:, 1::2] = PLUS + torch.randint(0, 3, (n, length - 1), generator=gen, device=gen.device)
        return out

    def solve(self, cfg, prompt):
        total = torch.zeros(prompt.shape[0], dtype=torch.long, device=prompt.device)
        term = prompt[:, 0].clone()  # the running product of the current additive term, signed
        for i in range(1, prompt.shape[1], 2):
            op, x = prompt[:, i], prompt[:, i + 1]
            times = op == TIMES
            total = torch.where(times, total, total + term)  # + or -: the term so far is complete
            term = torch.where(times, term * x, torch.where(op == MINUS, -x, x)) % MODULUS
        return ((total + term) % MODULUS)[:, None]  # (n, 1)


class StackManipulation(Task, task="stack_manipulation"):
    """The paper's generator: a stack of 1 to length - 1 random symbols (bottom first), then random actions
    for the remaining positions; a one-token prompt is a stack of one symbol."""

    def gen_prompt(self, cfg, length, n, gen, split):
        dev = gen.device
        stack = torch.randint(1, max(2, length), (n, 1), generator=gen, device=dev)  # (n, 1): 1 .. length - 1
        symbols = _bits(length, n, gen)
        actions = 2 + torch.randint(0, 3, (n, length), generator=gen, device=dev)  # pop, +a, +b
        return torch.where(torch.arange(length, device=dev)[None, :] < stack, symbols, actions)  # (n, length)

    def solve(self, cfg, prompt):
        n, length = prompt.shape
        rows = torch.arange(n, device=prompt.device)
        content = torch.zeros(n, length + 1, dtype=torch.long, device=prompt.device)  # bottom first
        height = torch.zeros(n, dtype=torch.long, device=prompt.device)
        for t in range(length):  # a stack symbol or +x pushes, pop pops (not below empty)
            tok = prompt[:, t]
            push = tok != 2
            content[rows, height] = torch.where(push, torch.where(tok >= 3, tok - 3, tok), content[rows, height])
            height = torch.where(push, height + 1, (height - 1).clamp(min=0))
        pos = torch.arange(length + 1, device=prompt.device)[None, :]  # (1, length + 1)
        top_first = content.gather(1, (height[:, None] - 1 - pos).clamp(min=0))  # (n, length + 1)
        return torch.where(pos < height[:, None], top_first, torch.where(pos == height[:, None], 5, 6))

    def scored(self, cfg, answer):
        return _up_to_end(answer, 5)


def _up_to_end(answer: Tensor, end: int) -> Tensor:
    """(n, A) True up to and including each row's first `end` token: its padding is not scored."""
    return (answer == end).long().cumsum(1) - (answer == end).long() == 0


class ModularArithmeticBrackets(Task, task="modular_arithmetic_brackets"):
    """Expressions of exactly `length` tokens from the paper's grammar, evaluated mod 5."""

    def gen_prompt(self, cfg, length, n, gen, split):
        draws = torch.rand(n, 3 * length + 3, generator=gen, device=gen.device).cpu().tolist()  # consumed in order
        rows = []
        for u in draws:
            tokens: list[int] = []
            _expression(length, iter(u), tokens)
            rows.append(tokens)
        return torch.tensor(rows, dtype=torch.long, device=gen.device)  # (n, length)

    def solve(self, cfg, prompt):
        values = [_value(row) for row in prompt.cpu().tolist()]
        return torch.tensor(values, dtype=torch.long, device=prompt.device)[:, None]  # (n, 1)


def _expression(length: int, u, out: list[int]) -> None:
    """Append an expression of exactly `length` tokens to `out`, choices read from the uniforms `u`:
    d, -d, (d), (-d), and for 5 tokens or more (left op right) with a left part of 1 to length - 4 tokens
    (the paper's `generate_one_expression_and_result`, with * among the operators)."""
    if length <= 4:
        digit = min(int(next(u) * MODULUS), MODULUS - 1)
        body = [MINUS, digit] if length in (2, 4) else [digit]
        out.extend([OPEN, *body, CLOSE] if length >= 3 else body)
        return
    left = 1 + min(int(next(u) * (length - 4)), length - 5)
    op = PLUS + min(int(next(u) * 3), 2)
    out.append(OPEN)
    _expression(left, u, out)
    out.append(op)
    _expression(length - left - 3, u, out)
    out.append(CLOSE)


def _value(tokens: list[int]) -> int:
    """The value mod 5 of an expression of the grammar, by recursive descent: expr := term (op term)*,
    term := digit | -term | (expr), with * before + and -."""
    pos = 0

    def term() -> int:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == MINUS:
            return -term()
        if tok == OPEN:
            v = expr()
            pos += 1  # the closing bracket
            return v
        return tok

    def product() -> int:
        nonlocal pos
        v = term()
        while pos < len(tokens) and tokens[pos] == TIMES:
            pos += 1
            v *= term()
        return v

    def expr() -> int:
        nonlocal pos
        v = product()
        while pos < len(tokens) and tokens[pos] in (PLUS, MINUS):
            sign = 1 if tokens[pos] == PLUS else -1
            pos += 1
            v += sign * product()
        return v

    return expr() % MODULUS


class OddsFirst(Task, task="odds_first"):
    """The symbols at odd positions (1st, 3rd, ...) then at even ones: the paper's definition (its code writes
    the even positions first, the mirror image; docs/SCIENCE.md)."""

    def gen_prompt(self, cfg, length, n, gen, split):
        return _bits(length, n, gen)

    def solve(self, cfg, prompt):
        return torch.cat([prompt[:, 0::2], prompt[:, 1::2]], 1)


class BinaryAddition(Task, task="binary_addition"):
    """The paper's generator: x + y in `length` tokens, x of 1 to length - 2 bits and y the rest, each a
    uniform number from 1 to 2^bits - 1 written least significant bit first and padded with zeros; the answer
    is the sum, least significant bit first, then 'end' (3), then '_' (4) to length + 1 tokens."""

    def gen_prompt(self, cfg, length, n, gen, split):
        dev = gen.device
        left = torch.randint(1, length - 1, (n, 1), generator=gen, device=dev)  # (n, 1): x's bits, 1 .. length - 2
        pos = torch.arange(length, device=dev)[None, :]  # (1, length)
        parts = (pos < left, pos > left)  # where x's bits are, where y's
        bits = _bits(length, n, gen)
        while True:  # a number that came out 0 draws its bits again: each is uniform on 1 .. 2^bits - 1
            redo = torch.zeros_like(bits, dtype=torch.bool)
            for part in parts:
                redo |= part & ~(bits.bool() & part).any(1, keepdim=True)
            if not bool(redo.any()):
                return torch.where(pos == left, 2, bits)  # (n, length): x + y
            bits = torch.where(redo, _bits(length, n, gen), bits)

    def solve(self, cfg, prompt):
        n, length = prompt.shape
        plus = (prompt == 2).long().argmax(1, keepdim=True)  # (n, 1)
        pos = torch.arange(length, device=prompt.device)[None, :]
        place = torch.where(pos < plus, pos, pos - plus - 1).clamp(min=0)
        weight = torch.where(pos == plus, 0, prompt * (1 << place))  # (n, length): each bit's value
        total = weight.sum(1, keepdim=True)  # (n, 1): x + y
        out = (total >> torch.arange(length + 1, device=prompt.device)[None, :]) & 1  # (n, length + 1) bits
        width = _bit_length(total)  # (n, 1): bits without leading zeros
        idx = torch.arange(length + 1, device=prompt.device)[None, :]
        return torch.where(idx < width, out, torch.where(idx == width, 3, 4))

    def scored(self, cfg, answer):
        return _up_to_end(answer, 3)


def _bit_length(x: Tensor) -> Tensor:
    """Bits of each (positive) integer in x: floor(log2 x) + 1, exactly, for x up to 2^62."""
    width = torch.zeros_like(x)
    for b in range(63):
        width = torch.where((x >> b) > 0, b + 1, width)
    return width
