"""What the benchmark scripts share: each keeps its own block of RESULTS.md between its two markers,
and the ones that start the app give it a free port. (Imported as `results` when a script runs from this
folder, as `benchmarks.results` under `python -m benchmarks.<name>`.)
"""
from __future__ import annotations

import socket
from pathlib import Path

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")
HEADER = ("# Benchmark results\n\nWritten by the benchmark commands; each keeps its own section between its "
          "markers.\n\n")


def write_block(start: str, end: str, body: str, path: Path = RESULTS) -> None:
    """Replace the text from `start` to `end` (the markers included) with `body` between them; append the
    block if the file has none. Every other block stays as it is."""
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else HEADER
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
