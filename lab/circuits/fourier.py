"""Grokking's Fourier picture: how the power of a modular-addition model's token embedding spreads over the
frequencies of Z_p, at each snapshot step.

Nanda et al. 2023 (Progress measures for grokking via mechanistic interpretability) found that a
transformer that groks a + b mod p computes with a few key frequencies k: it embeds each number x as
cos(2 pi k x / p) and sin(2 pi k x / p), and its embedding matrix, read along the token axis, holds most of
its power in those few frequencies once it generalises, while before the jump (memorising) the power is
spread. Here: the embedding rows of the numbers 0..p-1 (p x d_model) are projected on an orthonormal
Fourier basis of R^p (the constant vector and, for each k = 1..(p-1)/2, a cosine and a sine); a
frequency's power is the squared norm of its two projections, and the fraction that matters is the share
of the non-constant power held by the `top` strongest frequencies. No gradio; torch only to load weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np

TOP = 8  # the few key frequencies the acceptance reads (Nanda et al. found about 5 in their models)
JUMP = 0.9  # held-out exact-match that marks the jump (grokking) in a run's evaluations
RISE = 0.5  # held-out exact-match the rise has reached: snapshots before it are of a model still memorising


def fourier_basis(p: int) -> tuple[np.ndarray, np.ndarray]:
    """(basis, frequency): an orthonormal (p, p) basis of R^p as rows (the constant, then cos k, sin k for
    k = 1..(p-1)//2, and for even p the alternating vector at k = p/2), and each row's frequency k."""
    x = np.arange(p)
    rows, freq = [np.full(p, 1 / np.sqrt(p))], [0]
    for k in range(1, (p - 1) // 2 + 1):
        for f in (np.cos, np.sin):
            v = f(2 * np.pi * k * x / p)
            rows.append(v / np.linalg.norm(v))
            freq.append(k)
    if p % 2 == 0:
        rows.append(np.cos(np.pi * x) / np.sqrt(p))
        freq.append(p // 2)
    return np.stack(rows), np.asarray(freq)


def frequency_power(embedding: np.ndarray) -> tuple[np.ndarray, float]:
    """Power of a (p, d) embedding per frequency k = 1..p//2 (index k - 1) and in the constant component.
    The basis is orthonormal, so the powers and the constant sum to the squared Frobenius norm."""
    p = embedding.shape[0]
    basis, freq = fourier_basis(p)
    coeffs = basis @ embedding  # (p, d): each basis vector's projection, per embedding dimension
    per_row = (coeffs ** 2).sum(axis=1)  # (p,)
    power = np.array([per_row[freq == k].sum() for k in range(1, p // 2 + 1)])
    return power, float(per_row[freq == 0].sum())


@dataclass(frozen=True)
class Spectrum:
    """The embedding's spectrum at one step: power per frequency (k = 1.. at index k - 1), the `top`
    strongest frequencies and the share of the non-constant power they hold."""
    step: int
    power: np.ndarray
    top: tuple[int, ...]
    fraction: float


def spectrum(embedding: np.ndarray, step: int, top: int = TOP) -> Spectrum:
    power, _ = frequency_power(embedding)
    order = np.argsort(power)[::-1][:top]
    total = float(power.sum())
    return Spectrum(step, power, tuple(int(k) + 1 for k in order), float(power[order].sum() / total) if total else 0.0)


def number_embedding(cfg: Any, weights: dict) -> np.ndarray:
    """The token embedding's rows of the numbers 0..p-1 of a modular-addition run: (p, d_model)."""
    if cfg.task.name != "modular_addition":
        raise ValueError(f"task.name: the Fourier picture is of modular addition; this run's task is {cfg.task.name!r}")
    return weights["tok_emb.weight"][: cfg.task.modulus].float().numpy()


def spectra_over_training(store: Any, run_id: str, top: int = TOP) -> list[Spectrum]:
    """The embedding's spectrum at every snapshot step that kept weights, then at the final weights, in step order."""
    from lab.circuits import weights_over_training

    cfg = store.config(run_id)
    return [spectrum(number_embedding(cfg, weights), at, top) for at, weights in weights_over_training(store, run_id)]


def around_jump(spectra: list[Spectrum], evals: Iterable[tuple[int, float]], memorised: Optional[int] = None,
                jump: float = JUMP, rise: float = RISE) -> dict[str, Any]:
    """The share in the top frequencies around the held-out jump (Nanda et al. 2023: spread while the model
    memorises, concentrated once it generalises): `jump_step`, the first evaluation step with held-out
    exact-match >= `jump` (None if none); `start`; `before`, the last snapshot of the memorising model: at or
    before step `memorised` (where training accuracy first reached 95%, if given) and before held-out
    exact-match first reaches `rise` (the jump takes a few hundred steps, in which the key frequencies are
    already growing); `after`, the first snapshot at or after the jump; and `end`, each (step, fraction) or
    None; the end's strongest frequencies; and `top`."""
    if not spectra:
        return {}
    ordered = sorted(evals)
    jump_step: Optional[int] = next((int(s) for s, em in ordered if em >= jump), None)
    rise_step = next((int(s) for s, em in ordered if em >= rise), None)
    limit = None if rise_step is None else min(rise_step, memorised + 1 if memorised is not None else rise_step)
    before = [s for s in spectra if jump_step is not None and limit is not None and s.step < limit]
    after = [s for s in spectra if jump_step is not None and s.step >= jump_step]

    def at(s: Optional[Spectrum]) -> Optional[tuple[int, float]]:
        return None if s is None else (s.step, s.fraction)

    return {"top": len(spectra[-1].top), "jump_step": jump_step, "start": at(spectra[0]),
            "before": at(before[-1] if before else None), "after": at(after[0] if after else None),
            "end": at(spectra[-1]), "frequencies": spectra[-1].top}
