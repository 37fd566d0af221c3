"""The example notebooks (examples/*.ipynb) run top to bottom in a Jupyter kernel of this environment, as a
reader runs them, with small step counts put in after each one's parameters cell (as papermill injects
parameters); each ends in a cell that asserts what it teaches, so a notebook whose claim stops holding fails
here. Their runs go to a temporary run store. The notebooks are stored without outputs."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NOTEBOOKS = ("01_seed_exercises.ipynb", "02_induction_heads.ipynb", "03_ablation_grid.ipynb")
# the test's values: enough steps for each claim to hold on two busy cores, few enough for seconds per run
SMALL = {"01_seed_exercises.ipynb": {"STEPS": 100}, "02_induction_heads.ipynb": {"STEPS": 150},
         "03_ablation_grid.ipynb": {"STEPS": 60, "SEEDS": [0, 1]}}


def read(name: str):
    import nbformat

    return nbformat.read(EXAMPLES / name, as_version=4)


def test_the_three_notebooks_are_there_and_stored_without_outputs():
    assert sorted(p.name for p in EXAMPLES.glob("*.ipynb")) == sorted(NOTEBOOKS)
    for name in NOTEBOOKS:
        raw = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
        for cell in raw["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{name} has stored outputs"
        tagged = [c for c in raw["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and "STEPS =" in "".join(tagged[0]["source"]), f"{name}: one parameters cell"
        last = "".join(raw["cells"][-1]["source"])
        assert raw["cells"][-1]["cell_type"] == "code" and "assert " in last, f"{name} ends without its check"


def with_parameters(book, values: dict):
    """The notebook with a cell after its parameters cell that sets `values` (papermill's way)."""
    import nbformat

    at = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    source = "# injected by tests/test_notebooks.py\n" + "\n".join(f"{k} = {v!r}" for k, v in values.items())
    book.cells.insert(at + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    return book


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A kernelspec that runs this interpreter (sys.executable), so the kernel has this environment's packages."""
    folder = tmp_path_factory.mktemp("jupyter")
    spec = folder / "kernels" / "lab-tests"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "lab tests", "language": "python"}), encoding="utf-8")
    os.environ["JUPYTER_PATH"] = str(folder) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    return "lab-tests"


@pytest.mark.app
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_top_to_bottom_and_its_claim_holds(name, kernel_name, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    values = {"RUNS_DIR": str(tmp_path / "runs"), "THREADS": 1, **SMALL[name]}
    book = with_parameters(read(name), values)
    client = NotebookClient(book, kernel_name=kernel_name, timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # CellExecutionError, with the cell and its traceback, if any cell fails
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was shown"
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert list((tmp_path / "runs").iterdir()), "the runs went elsewhere"
