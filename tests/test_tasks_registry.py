"""The task registry: each task is declared once (its shape in lab/tasks/shapes.py, listed in SHAPES), its
generator in lab/tasks/batches.py holds that shape, every list of task names comes from the registry, and the
batches stay the same random streams they always were."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import torch

from lab.tasks import batches as tasks, shapes as taskshapes
from lab.config import TRANSFORMERS, TASK_NAMES, TaskConfig
from lab.fields import declared
from lab.tasks.shapes import SHAPES, TaskShape, loss_baselines, readers, task_shape

pytestmark = pytest.mark.usefixtures("one_thread")  # torch at one intra-op thread (tests/conftest.py)


def test_every_task_is_one_shape_held_by_one_generator():
    assert TASK_NAMES == tuple(SHAPES) == tuple(tasks.TASKS)  # one list, in one order
    name_field = next(f for f in declared(TaskConfig) if f.name == "name")
    assert name_field.choices == TASK_NAMES
    for name in TASK_NAMES:
        task = tasks.get_task(name)
        assert task.shape is task_shape(name) and task.shape.name == name
        assert not isinstance(task, TaskShape)  # composition: the generator holds its shape
        assert type(task) is tasks.Task.generators[name]
        assert task.vocab_size is not None and task.name == name  # the shape reads through the generator


def test_a_generator_without_a_shape_or_a_second_generator_is_refused(monkeypatch):
    monkeypatch.setattr(tasks.Task, "generators", dict(tasks.Task.generators))

    class Unregistered(tasks.Task, task="no_such_task"):
        pass

    with pytest.raises(TypeError, match="no_such_task"):
        tasks._registry()
    with pytest.raises(TypeError, match="two generators"):
        class Second(tasks.Task, task="copy"):
            pass


@pytest.mark.app
def test_the_shapes_import_no_torch():
    code = "import sys, lab.tasks.shapes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_task_field_help_names_the_tasks_that_read_it():
    assert readers("n_symbols") == ("copy", "reverse", "sort", "induction", "histogram")
    assert readers("modulus") == readers("train_fraction") == ("modular_addition",)
    helps = {f.name: f.spec.help for f in declared(TaskConfig)}
    assert "(copy, reverse, sort, induction, histogram)" in helps["n_symbols"]
    assert helps["modulus"].startswith("modular_addition only: ") and helps["text"].startswith("text only: ")
    assert "the first 90% trains, the last 10% is held out" in helps["text"]


def test_only_the_text_task_has_a_unigram_baseline():
    for name in TASK_NAMES:
        cfg = TaskConfig(name=name, min_len=16 if name == "text" else 8, max_len=16)
        base = loss_baselines(cfg)
        assert (base.unigram is not None) == (name == "text")
        assert base.unigram == taskshapes.task_shape(name).unigram(cfg)


# sha256 of the batches below, from the generators as they were before the registry held shapes: a change
# here means a task's random stream changed, and stored runs no longer replay
PINNED = "3544b1c021e6c218cbaec2fc92faec54406d26072211f16ce67403086911f8b0"


PINNED_TASKS = ("copy", "reverse", "sort", "addition", "modular_addition", "induction", "parity", "histogram", "text")


def test_batches_are_the_pinned_random_streams():
    digest = hashlib.sha256()
    for name in PINNED_TASKS:
        task = tasks.get_task(name)
        cfg = TaskConfig(name=name, min_len=4 if task.lm else 1, max_len=6, n_symbols=7, modulus=13)
        for arch in TRANSFORMERS if not task.lm else ("decoder",):
            gen = torch.Generator().manual_seed(3)
            batches = [task.batch(cfg, arch, 5, gen) for _ in range(3)]
            batches += tasks.eval_batches(cfg, arch, "eval", 24, 16) + [tasks.probe(cfg, arch)]
            for b in batches:
                for t in (b.inp, b.tgt, b.src):
                    digest.update(b"-" if t is None else str(tuple(t.shape)).encode() + t.numpy().tobytes())
    assert digest.hexdigest() == PINNED
