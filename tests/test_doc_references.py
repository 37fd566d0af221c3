"""Comments and docs name files that exist: a path into this repository (`lab/engine/jobs.py`,
`docs/SCIENCE.md`, `tests/`) written in a .py or .md file must exist, relative to the repository's root or
to the file that names it, and no comment or doc points at a line number (`name.py` followed by a colon and
a line: it goes stale at the next edit above it; name the function instead). Files moved into lab/engine/
and lab/teach/ had left about 15 such references behind, one of them written into benchmarks/RESULTS.md by
benchmarks/run_all.py.

A path whose first folder is not one of this repository's (`spaces/zero/client.py`, `gradio/...`) names
another package's file and is not checked; neither are patterns (`phone-*.png`) or run folders (`runs/`).
The README's count of Learn pages is checked against the pages themselves.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from tests.helpers import REPO

SKIP_DIRS = {".git", "__pycache__", "runs", ".venv", "venv", "node_modules", ".pytest_cache", "build", "dist"}
# a path of at least one folder: folder/.../name (a file or, ending in "/", a folder)
PATH = re.compile(r"(?<![\w/.\-@$~])((?:[A-Za-z_][\w.\-]*/)+(?:[\w\-]+(?:\.[A-Za-z]\w*)*)?)(?=[^\w/*{<\-]|$)")
LINE_REF = re.compile(r"(?<![\w/.\-])[\w/.\-]+\.(?:py|md):\d+\b")
NUMBERS = {"eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15}


def texts() -> list[Path]:
    """The repository's .py and .md files (not run stores, caches or environments)."""
    out = []
    for folder, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        out += [Path(folder) / n for n in names if n.endswith((".py", ".md"))]
    return sorted(out)


def top_level() -> set[str]:
    return {p.name for p in REPO.iterdir() if not p.name.startswith(".") and p.name not in SKIP_DIRS}


def missing_paths(path: Path, text: str, top: set[str]) -> list[str]:
    """`file:line: reference` for each path into this repository that `text` (the file `path`) names and
    that exists neither from the root nor from the file's folder."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            ref = m.group(1).rstrip(".")
            first = ref.split("/")[0]
            if first not in top and not (path.parent / first).exists():
                continue  # another package's file, or a folder made at run time
            if not ((REPO / ref).exists() or (path.parent / ref).exists()):
                out.append(f"{path.relative_to(REPO)}:{number}: {ref}")
    return out


def test_every_path_a_comment_or_doc_names_exists():
    top = top_level()
    problems = [p for f in texts() for p in missing_paths(f, f.read_text(encoding="utf-8", errors="replace"), top)]
    assert not problems, "paths that do not exist (moved? name the new place):\n" + "\n".join(problems)


def test_no_comment_or_doc_points_at_a_line_number():
    problems = [f"{f.relative_to(REPO)}:{n}: {m.group(0)}" for f in texts()
                for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
                for m in LINE_REF.finditer(line)]
    assert not problems, "line numbers go stale; name the function or section instead:\n" + "\n".join(problems)


def test_the_checks_catch_a_moved_file_and_a_line_number():
    """The checks themselves: a moved module is reported, an existing one, another package's path and a
    pattern are not; a line reference is found. (The examples are put together here, so that this file
    itself names no missing path.)"""
    moved, doc = "lab/" + "presets.py", REPO / "docs" / "x.md"
    text = (f"See {moved} and lab/teach/presets/catalog.py, lab/engine/ and docs/screenshots/phone-*.png;\n"
            "spaces/zero/client.py is the spaces package's, ../README.md is beside docs/.")
    assert missing_paths(doc, text, top_level()) == [f"{doc.relative_to(REPO)}:1: {moved}"]
    line = "as app.py" + ":51 says; not x.py: a, not v1.2:3"
    assert [m.group(0) for m in LINE_REF.finditer(line)] == ["app.py" + ":51"]


def test_the_readme_counts_the_learn_pages():
    from lab.teach.lesson_pages import PAGES

    said = re.search(r"\*\*Learn\*\*: (\w+) short pages", (REPO / "README.md").read_text(encoding="utf-8"))
    assert said is not None and NUMBERS.get(said.group(1)) == len(PAGES), (said and said.group(1), len(PAGES))
