"""Transformer Ablation Lab as a library: configure, train, inspect and compare small Transformers from a
notebook or a script (docs/python-api.md).

    import lab
    cfg = lab.make_config(task="copy", n_layers=2, steps=300)
    run = lab.train(cfg)
    run.metrics().tail()
    lab.plot_attention(run)

The names below are the public API (lab/api/). They load on first use (PEP 562), so `import lab` itself
imports nothing else: no torch, and never gradio, Ray or Trackio (the app loads only in `lab.demo()`).
Everything else in the package is internal and may change. `python -m lab` and the console command
`ablation-lab` are the command line (lab/cli/main.py).
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "RunConfig", "ConfigError", "make_config", "make_grid", "count_params", "config_keywords",
    "Run", "train", "train_many", "load_run", "list_runs", "demo",
    "ActivationCache", "untrained", "presets", "preset_configs", "train_preset", "explain_preset", "PresetRuns",
    "PatchingGrids", "to_transformer_lens",
    "plot_curves", "plot_bands", "bands_frame", "plot_attention", "plot_pca", "plot_importance", "plot_logit_lens",
    "plot_params",
]


def __getattr__(name: str) -> Any:
    if name in __all__ or name == "api":
        import lab.api as api  # the submodule itself: `from lab import api` would call this function again

        value = api if name == "api" else getattr(api, name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
