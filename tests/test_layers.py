"""The layer order of the code, enforced: each module imports only from its own layer or the ones below.

    1 core       lab/*.py: config and its field declarations, tasks, positional, model, optim, trainer, records
    2 engine     lab/engine/: the run store, jobs, worker processes, limits, grids, publishing
    3 views      lab/views/: analysis and plots
    4 circuits   lab/circuits/: head roles, activation patching, the Fourier picture
    5 teaching   lab/teach/: presets, lessons
    6 cli        lab/cli/: the command line, and lab/__main__.py
    7 ui         ui/: the app's tabs
    8 app        app.py
    9 api        lab/api/: the public Python API for notebooks (docs/python-api.md), and the package's front
                 door lab/__init__.py, which re-exports it lazily; it may load the app (`lab.demo()`)

Every import counts, including the ones inside functions (a lazy import is still an arrow). And no function
in ui/ is over 60 lines.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = {"lab.engine": 2, "lab.views": 3, "lab.circuits": 4, "lab.teach": 5, "lab.cli": 6, "lab.__main__": 6, "ui": 7,
          "app": 8, "lab.api": 9}
EXACT = {"lab": 9}  # the package itself (lab/__init__.py), not the modules under it


def layer(module: str) -> int:
    """A module's layer: its own entry in EXACT, else the longest matching prefix above, else the core (1)."""
    if module in EXACT:
        return EXACT[module]
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return LAYERS[prefix]
    return 1


def modules() -> dict[str, Path]:
    found = {"app": REPO / "app.py"}
    for base in ("lab", "ui"):
        for path in (REPO / base).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def violations(mods: dict[str, Path]) -> list[str]:
    known = set(mods)
    bad = []
    for module, path in sorted(mods.items()):
        for target in sorted(imports(module, path, known)):
            if layer(target) > layer(module):
                bad.append(f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})")
    return bad


def test_no_module_imports_a_higher_layer():
    mods = modules()
    assert len(mods) > 40 and {"lab.config", "lab.engine.jobs", "lab.engine.grid", "ui.train", "app", "lab",
                               "lab.api.runs"} <= set(mods)
    assert violations(mods) == []


def test_no_import_cycles():
    mods = modules()
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_check_catches_an_upward_import(tmp_path):
    """The checker itself: a core module that imports the engine is reported."""
    mods = modules()
    fake = tmp_path / "config.py"
    fake.write_text("from lab.engine.store import RunStore\n", encoding="utf-8")
    mods["lab.config"] = fake
    assert violations(mods) == ["lab.config (layer 1) imports lab.engine.store (layer 2)"]


MAX_UI_FUNCTION_LINES = 60  # a page's builder or handler longer than this mixes concepts: split it by what it builds


def long_functions(folder: Path) -> list[str]:
    """`path:function (lines)` for every function under `folder` longer than MAX_UI_FUNCTION_LINES."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_UI_FUNCTION_LINES:
                    found.append(f"{path.relative_to(folder.parent)}:{node.name} ({n} lines)")
    return found


def test_no_ui_function_is_over_60_lines(tmp_path):
    assert long_functions(REPO / "ui") == []
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "long.py").write_text("def f():\n" + "    x = 1\n" * 60)  # 61 lines: the check sees it
    assert long_functions(folder) == [str(Path("pages", "long.py")) + ":f (61 lines)"]
