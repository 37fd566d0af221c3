"""Training tokens/s against sequence length for a Transformer and an LSTM of the same size, as
benchmarks/sequence_length.py measured them for this project (lab/teach/sequence_length.json, one entry per
device type), in the words the why-attention preset quotes.

Vaswani et al. 2017, section 4 and Table 1: a recurrent layer needs O(n) sequential operations, a
self-attention layer O(1), so attention trains faster on parallel hardware as sequences grow. The preset's
own two runs measure one length (16); the scan shows the trend, on one CPU thread (where nothing runs in
parallel, so the argument does not apply) and on a GPU (where it does, from some length on).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

MEASURED = Path(__file__).with_name("sequence_length.json")


def load(path: Path = MEASURED) -> dict[str, Any]:
    """The stored scan by device type ('cpu', 'cuda'); {} when none was stored."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _ratios(entry: dict[str, Any]) -> list[tuple[int, float]]:
    """(T, Transformer tokens/s over LSTM tokens/s) per measured length."""
    return [(r["T"], r["transformer"] / r["lstm"]) for r in entry.get("rows", [])]


def _span(ratios: list[tuple[int, float]]) -> str:
    """'from 0.98x at T = 16 to 1.78x at T = 256': the LSTM's tokens/s over the Transformer's."""
    (t0, r0), (t1, r1) = ratios[0], ratios[-1]
    return f"from {1 / r0:.2f}x at T = {t0} to {1 / r1:.2f}x at T = {t1} of"


def sentence(scan: Optional[dict[str, Any]] = None) -> str:
    """What the stored scan says, in one clause ending the sentence ('' without one)."""
    scan = load() if scan is None else scan
    parts = []
    cpu = _ratios(scan.get("cpu") or {})
    if cpu:
        parts.append(f"on one CPU thread the LSTM's tokens/s went {_span(cpu)} the Transformer's")
    gpu = _ratios(scan.get("cuda") or {})
    if gpu:
        device = scan["cuda"].get("device", "a GPU")
        over = next((t for t, r in gpu if r > 1), None)
        parts.append(f"on {device} the Transformer overtook it at T = {over} ({dict(gpu)[over]:.2f}x), where the "
                     "recurrence's sequential steps dominate" if over is not None else
                     f"on {device} the LSTM stayed ahead up to T = {gpu[-1][0]}, the longest measured")
    if not parts:
        return ""
    return "against sequence length (benchmarks/sequence_length.py) " + ", and ".join(parts) + "."
