"""Toy tasks: layouts and shapes, loss masks, answers checked by plain Python, seeding, splits."""
from __future__ import annotations

import itertools

import pytest
import torch

from lab.config import TRANSFORMERS, TASK_NAMES, ConfigError, ModelConfig, RunConfig, TaskConfig, TrainConfig
from lab.tasks.batches import (
    IGNORE_INDEX,
    TASKS,
    Batch,
    eval_batches,
    get_task,
    induction_sequences,
    probe,
)

SEQ2SEQ = [name for name in TASK_NAMES if not get_task(name).lm]
CASES = [(name, arch) for name, arch in itertools.product(TASK_NAMES, TRANSFORMERS)
         if not (get_task(name).lm and arch == "encoder-decoder")]  # language-model tasks are decoder-only


pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def small(name: str, **kw) -> TaskConfig:
    shortest = 4 if get_task(name).lm else 3 if name == "binary_addition" else 1  # a bit, '+', a bit
    base = dict(name=name, min_len=shortest, max_len=6, n_symbols=6, modulus=11)
    return TaskConfig(**{**base, **kw})


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def split_layout(task, cfg: TaskConfig, arch: str, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the batch layout and return (prompt, answer), each (n, len); the answer holds IGNORE_INDEX where
    it is not scored (the padding after 'end' of two tasks: compare with `scored_answer`)."""
    sep = task.sep(cfg)
    if arch == "encoder-decoder":
        assert b.src is not None
        assert (b.tgt[:, 0] != IGNORE_INDEX).all()  # the answer's first token is always scored
        assert (b.inp[:, 0] == sep).all()
        fed = b.tgt[:, :-1] != IGNORE_INDEX
        assert torch.equal(b.inp[:, 1:][fed], b.tgt[:, :-1][fed])  # teacher forcing: shifted answer
        return b.src, b.tgt
    assert b.src is None
    p = int((b.inp[0] == sep).long().argmax())  # inp = prompt SEP answer[:-1]: the first SEP
    assert (b.inp[:, p] == sep).all() and (b.inp[:, :p] != sep).all()
    assert (b.tgt[:, :p] == IGNORE_INDEX).all()  # non-answer positions are not scored
    assert (b.tgt[:, p] != IGNORE_INDEX).all()
    fed = b.tgt[:, p:-1] != IGNORE_INDEX
    assert torch.equal(b.inp[:, p + 1:][fed], b.tgt[:, p:-1][fed])
    return b.inp[:, :p], b.tgt[:, p:]


def scored_answer(name: str, answer: list[int]) -> list[int]:
    """A right answer as the batch scores it: every token, but for the tasks whose answers end with 'end' and
    padding, IGNORE_INDEX after 'end' (Delétang et al. 2023's accuracy mask), by a Python loop."""
    end = {"stack_manipulation": 5, "binary_addition": 3}.get(name)
    cut = answer.index(end) + 1 if end in answer else len(answer)
    return [t if i < cut else IGNORE_INDEX for i, t in enumerate(answer)]


def python_answer(name: str, cfg: TaskConfig, prompt: list[int]) -> list[int]:
    """The right answer, computed independently with Python lists and ints."""
    if name == "copy":
        return list(prompt)
    if name == "reverse":
        return prompt[::-1]
    if name == "sort":
        return sorted(prompt)
    if name == "addition":
        n = (len(prompt) - 1) // 2
        assert prompt[n] == 10 and len(prompt) == 2 * n + 1  # a '+' b, most significant digit first
        a, b = int("".join(map(str, prompt[:n]))), int("".join(map(str, prompt[n + 1:])))
        return [int(c) for c in reversed(str(a + b).zfill(n + 1))]  # least significant first
    if name == "modular_addition":
        a, b = prompt
        return [(a + b) % cfg.modulus]
    if name == "parity":
        return [sum(prompt) % 2]
    if name == "histogram":
        return [cfg.n_symbols + prompt.count(x) - 1 for x in prompt]
    return chomsky_answer(name, prompt)


def chomsky_answer(name: str, prompt: list[int]) -> list[int]:
    """The tasks of Delétang et al. 2023, from their definitions, with Python strings, lists and eval."""
    if name == "even_pairs":
        text = "".join("ab"[t] for t in prompt)
        pairs = sum(text[i:i + 2] in ("ab", "ba") for i in range(len(text) - 1))
        return [2 if pairs % 2 == 0 else 3]  # 'even', 'odd'
    if name == "cycle_navigation":
        where = 0
        for t in prompt:
            where = (where + {0: 0, 1: 1, 2: -1}[t]) % 5
        return [3 + where]  # '@0' .. '@4'
    if name in ("modular_arithmetic", "modular_arithmetic_brackets"):
        text = "".join("01234+-*()"[t] for t in prompt)
        return [eval(text) % 5]  # Python's precedence: * before + and -; unary minus
    if name == "stack_manipulation":
        stack: list[int] = []
        for t in prompt:
            if t == 2:
                stack = stack[:-1]
            else:
                stack.append(t if t < 2 else t - 3)
        out = stack[::-1] + [5]
        return out + [6] * (len(prompt) + 1 - len(out))  # 'end', then '_'
    if name == "odds_first":
        return prompt[0::2] + prompt[1::2]
    if name == "binary_addition":
        plus = prompt.index(2)
        x, y = (int("".join(map(str, bits[::-1])), 2) for bits in (prompt[:plus], prompt[plus + 1:]))
        assert x > 0 and y > 0  # uniform on 1 .. 2^bits - 1
        out = [int(c) for c in bin(x + y)[2:][::-1]] + [3]
        return out + [4] * (len(prompt) + 1 - len(out))
    raise AssertionError(name)


def all_lengths(task, cfg: TaskConfig) -> list[int]:
    return task.lengths(cfg, "train") + task.lengths(cfg, "ood")


# ---- shapes, masks and answers -------------------------------------------------------------


@pytest.mark.parametrize("name, arch", CASES)
def test_shapes_consistent_with_max_seq_len(name, arch):
    task, cfg = get_task(name), small(name)
    longest = 0
    for length in all_lengths(task, cfg):
        b = task.batch(cfg, arch, 3, gen(length), length, "eval")
        assert b.inp.shape == b.tgt.shape and b.inp.shape[0] == 3
        assert b.inp.dtype == b.tgt.dtype == torch.long
        if task.lm:
            assert b.inp.shape[1] == length - 1
        elif arch == "encoder-decoder":
            assert b.src.shape == (3, task.prompt_len(cfg, length))
            assert b.inp.shape[1] == task.answer_len(cfg, length)
        else:
            assert b.inp.shape[1] == task.prompt_len(cfg, length) + task.answer_len(cfg, length)
        longest = max(longest, b.inp.shape[1], 0 if b.src is None else b.src.shape[1])
    assert longest == task.max_seq_len(cfg, arch)
    # and that is exactly the n_ctx the config asks for
    RunConfig(model=ModelConfig(arch=arch, n_ctx=longest), task=cfg)
    with pytest.raises(ConfigError) as info:
        RunConfig(model=ModelConfig(arch=arch, n_ctx=longest - 1), task=cfg)
    assert info.value.field == "model.n_ctx"


@pytest.mark.parametrize("name, arch", [c for c in CASES if not get_task(c[0]).lm])
def test_answers_are_right(name, arch):
    task, cfg = get_task(name), small(name)
    lengths = sorted(set(all_lengths(task, cfg)))
    for length in lengths:
        b = task.batch(cfg, arch, 64, gen(100 + length), length, "eval")
        prompt, answer = split_layout(task, cfg, arch, b)
        assert prompt.shape[1] == task.prompt_len(cfg, length)
        assert answer.shape[1] == task.answer_len(cfg, length)
        assert (prompt >= 0).all() and (prompt < task.prompt_symbols(cfg)).all()  # prompt symbols only
        scored = answer != IGNORE_INDEX
        assert (answer[scored] >= 0).all() and (answer[scored] < task.sep(cfg)).all()
        assert (b.inp < task.vocab_size(cfg)).all() and (b.inp >= 0).all()
        for p, a in zip(prompt.tolist(), answer.tolist()):
            assert a == scored_answer(name, python_answer(name, cfg, p)), (p, a)


@pytest.mark.parametrize("name, arch", CASES)
def test_training_batches_use_training_lengths(name, arch):
    task, cfg = get_task(name), small(name)
    g = gen(3)
    seen = set()
    for _ in range(60):
        b = task.batch(cfg, arch, 2, g)
        t = b.inp.shape[1] if b.src is None else b.src.shape[1]
        seen.add(t)
    want = {len_of(task, cfg, arch, n) for n in task.lengths(cfg, "train")}
    assert seen == want


def len_of(task, cfg: TaskConfig, arch: str, length: int) -> int:
    if task.lm:
        return length - 1
    if arch == "encoder-decoder":
        return task.prompt_len(cfg, length)
    return task.prompt_len(cfg, length) + task.answer_len(cfg, length)


def test_addition_answers_with_carries():
    task, cfg = get_task("addition"), small("addition")
    prompt = torch.tensor([[9, 9, 9, 10, 0, 0, 1], [1, 2, 3, 10, 4, 5, 6], [0, 0, 0, 10, 0, 0, 0]])
    assert task.solve(cfg, prompt).tolist() == [[0, 0, 0, 1], [9, 7, 5, 0], [0, 0, 0, 0]]
    assert task.label(cfg, 10) == "+" and task.label(cfg, task.sep(cfg)) == "|"


def test_parity_and_histogram_examples():
    cfg = small("histogram", n_symbols=4)
    hist = get_task("histogram")
    assert hist.solve(cfg, torch.tensor([[2, 0, 2, 2, 3]])).tolist() == [[6, 4, 6, 6, 4]]  # counts 3,1,3,3,1
    assert hist.label(cfg, 6) == "#3"
    assert hist.vocab_size(cfg) == 4 + cfg.ood_max_len + 1  # symbols, every possible count, SEP
    par = get_task("parity")
    assert par.solve(small("parity"), torch.tensor([[1, 0, 1], [1, 1, 1]])).tolist() == [[0], [1]]


def test_sort_has_many_repeats_in_half_the_samples():
    task, cfg = get_task("sort"), small("sort", n_symbols=9)
    prompt = task.gen_prompt(cfg, 6, 4000, gen(0), "train")
    narrow = ((prompt.max(1).values - prompt.min(1).values) < 3).float().mean().item()  # drawn from 3 symbols
    assert 0.45 < narrow < 0.6
    assert set(prompt.flatten().tolist()) == set(range(9))


# ---- induction -----------------------------------------------------------------------------


def test_induction_with_encoder_decoder_raises():
    task, cfg = get_task("induction"), small("induction")
    for call in (lambda: task.check(cfg, "encoder-decoder"), lambda: task.max_seq_len(cfg, "encoder-decoder"),
                 lambda: RunConfig(model=ModelConfig(arch="encoder-decoder"), task=cfg)):
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.field == "task.name"
        assert "induction" in str(info.value)
    with pytest.raises(ConfigError) as info:
        task.check(TaskConfig(name="induction", min_len=3), "decoder")
    assert info.value.field == "task.min_len"


@pytest.mark.parametrize("length", [4, 5, 12, 33])
def test_induction_mask_scores_only_repeats(length):
    seq, scored = induction_sequences(8, length, 300, gen(length))
    assert seq.shape == scored.shape == (300, length)
    starts, periods = set(), set()
    for s, m in zip(seq.tolist(), scored.tolist()):
        first = m.index(True)  # scored positions are one suffix: the repeat runs to the end
        assert all(m[first:]) and not any(m[:first])
        # some period P: every scored token equals the token P earlier, the first copy unscored
        fits = [p for p in range(2, max(2, length // 2) + 1)
                if first - p >= 0 and all(s[i] == s[i - p] for i in range(first, length))]
        assert fits, (s, m)
        starts.add(first)
        periods.update(fits)
    if length >= 12:  # offset and period vary: a fixed offset would let one layer solve it by position
        assert len(starts) > 3 and len(periods) > 3


def test_induction_batch_layout():
    task, cfg = get_task("induction"), small("induction", max_len=10)
    b = task.batch(cfg, "decoder", 50, gen(1), 10)
    assert b.inp.shape == b.tgt.shape == (50, 9)
    assert (b.tgt[:, -1] != IGNORE_INDEX).all()  # the last token is always inside the repeat
    seq = torch.cat([b.inp, b.tgt[:, -1:]], 1)  # (50, 10): the whole sequence
    scored = b.tgt != IGNORE_INDEX
    assert torch.equal(b.tgt[scored], seq[:, 1:][scored])  # targets are the next tokens
    assert (b.inp < task.vocab_size(cfg)).all()
    assert scored.float().mean() > 0.2


# ---- seeding, splits, held-out batches --------------------------------------------------------


def batches_equal(a: Batch, b: Batch) -> bool:
    same_src = (a.src is None and b.src is None) or (
        a.src is not None and b.src is not None and torch.equal(a.src, b.src))
    return torch.equal(a.inp, b.inp) and torch.equal(a.tgt, b.tgt) and same_src


@pytest.mark.parametrize("name, arch", CASES)
def test_generation_is_reproducible_from_the_seed(name, arch):
    task, cfg = get_task(name), small(name)
    torch.manual_seed(1)
    a = [task.batch(cfg, arch, 16, g) for g in [gen(5)] for _ in range(3)]
    torch.manual_seed(2)  # the global RNG plays no part
    b = [task.batch(cfg, arch, 16, g) for g in [gen(5)] for _ in range(3)]
    c = [task.batch(cfg, arch, 16, g) for g in [gen(6)] for _ in range(3)]
    assert all(batches_equal(x, y) for x, y in zip(a, b))
    assert not all(batches_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("p, fraction", [(11, 0.3), (7, 0.5), (3, 0.95), (2, 0.95)])
def test_modular_addition_splits_are_disjoint_and_complete(p, fraction):
    task, cfg = get_task("modular_addition"), small("modular_addition", modulus=p, train_fraction=fraction)
    train = {tuple(x) for x in task.pairs(cfg, "train").tolist()}
    test = {tuple(x) for x in task.pairs(cfg, "test").tolist()}
    assert len(train) == task.pairs(cfg, "train").shape[0]  # no duplicates
    assert len(test) == task.pairs(cfg, "test").shape[0]
    assert not train & test
    assert train | test == {(a, b) for a in range(p) for b in range(p)}
    assert len(test) >= 1  # something is always held out
    assert abs(len(train) - fraction * p * p) <= 1
    # training batches draw from training pairs only, held-out batches from held-out pairs only
    for arch in TRANSFORMERS:
        tr = task.batch(cfg, arch, 200, gen(0))
        ev = eval_batches(cfg, arch, "eval", 200)
        tr_prompt = tr.inp[:, :2] if arch == "decoder" else tr.src
        ev_prompt = torch.cat([e.inp[:, :2] if arch == "decoder" else e.src for e in ev])
        assert {tuple(x) for x in tr_prompt.tolist()} <= train
        assert {tuple(x) for x in ev_prompt.tolist()} <= test
    assert eval_batches(cfg, "decoder", "ood", 100) == []


@pytest.mark.parametrize("name, arch", CASES)
def test_eval_batches_are_deterministic(name, arch):
    cfg = small(name)
    torch.manual_seed(0)
    a = eval_batches(cfg, arch, "eval", 100, batch_size=32)
    torch.manual_seed(1)
    b = eval_batches(cfg, arch, "eval", 100, batch_size=32)
    assert len(a) == len(b) > 0
    assert all(batches_equal(x, y) for x, y in zip(a, b))
    assert sum(x.inp.shape[0] for x in a) >= 100
    ood = eval_batches(cfg, arch, "ood", 100, batch_size=32)
    if get_task(name).has_ood:
        assert all(not batches_equal(x, y) for x, y in zip(a, ood) if x.inp.shape == y.inp.shape)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_ood_lengths(name):
    task = get_task(name)
    arch = "decoder"
    for cfg, want in ((small(name), list(range(7, 13))), (small(name, ood_len=9), [7, 8, 9])):
        if not task.has_ood:
            assert task.lengths(cfg, "ood") == [] and eval_batches(cfg, arch, "ood", 50) == []
            continue
        assert task.lengths(cfg, "ood") == want  # max_len + 1 .. ood_max_len
        assert task.lengths(cfg, "eval") == list(range(cfg.min_len, cfg.max_len + 1))
        got = sorted({b.inp.shape[1] for b in eval_batches(cfg, arch, "ood", 50)})
        assert got == sorted({len_of(task, cfg, arch, n) for n in want})
        # evenly spread: every length gets the same number of samples
        counts = {}
        for b in eval_batches(cfg, arch, "ood", 50):
            counts[b.inp.shape[1]] = counts.get(b.inp.shape[1], 0) + b.inp.shape[0]
        assert len(set(counts.values())) == 1


@pytest.mark.parametrize("name, arch", CASES)
def test_probe_is_one_fixed_sample_at_max_len(name, arch):
    task, cfg = get_task(name), small(name)
    a, b = probe(cfg, arch), probe(cfg, arch)
    assert batches_equal(a, b)
    assert a.inp.shape[0] == 1
    assert (a.inp.shape[1] if a.src is None else a.src.shape[1]) == len_of(task, cfg, arch, cfg.max_len)


def test_registry_and_labels():
    assert set(TASKS) == set(TASK_NAMES)
    for name in SEQ2SEQ:
        task, cfg = get_task(name), small(name)
        assert task.description
        assert task.sep(cfg) == task.vocab_size(cfg) - 1  # SEP is the last token
        assert task.label(cfg, task.sep(cfg)) in ("|", "=")
    assert get_task("modular_addition").label(small("modular_addition"), 11) == "="


def test_batch_to_device_keeps_values():
    b = get_task("copy").batch(small("copy"), "encoder-decoder", 2, gen(0))
    c = b.to("cpu")
    assert batches_equal(b, c)


@pytest.mark.parametrize("name, arch", [c for c in CASES if not get_task(c[0]).lm])
def test_the_gpu_batch_source_gives_right_answers_at_training_lengths(name, arch):
    """The CUDA path of the trainer's batch source (tokens from a generator on the device, each batch's
    length from a CPU generator: no sync per step), run here with the CPU as the device."""
    from lab.trainer import batch_source

    cfg = RunConfig(model=ModelConfig(arch=arch, n_ctx=64), task=small(name),
                    train=TrainConfig(batch_size=8, seed=5))
    task = get_task(name)
    draws = [batch_source(cfg, torch.device("cpu"), on_device=True) for _ in range(2)]
    lengths = torch.Generator().manual_seed(5)  # the source's length stream, drawn alone
    seen = set()
    for _ in range(25):
        a, b = draws[0](), draws[1]()
        assert batches_equal(a, b)  # reproducible from the seed
        prompt, answer = split_layout(task, cfg.task, arch, a)
        length = int(torch.randint(cfg.task.min_len, cfg.task.max_len + 1, (1,), generator=lengths))
        assert prompt.shape == (8, task.prompt_len(cfg.task, length))
        for p, ans in zip(prompt.tolist(), answer.tolist()):
            assert ans == scored_answer(name, python_answer(name, cfg.task, p))
        seen.add(prompt.shape[1])
    assert seen == {task.prompt_len(cfg.task, n) for n in task.lengths(cfg.task, "train")}
    cpu = batch_source(cfg, torch.device("cpu"))()  # the CPU path: one generator, as task.batch alone
    assert batches_equal(cpu, task.batch(cfg.task, arch, 8, gen(5)))
