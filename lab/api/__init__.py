"""The public Python API (docs/python-api.md), re-exported by the package: `import lab; lab.train(...)`.

- configs (lab/api/configs.py): `make_config`, `make_grid`, `count_params`, `config_keywords`, `RunConfig`,
  `ConfigError` (a ValueError naming the field)
- runs (lab/api/runs.py): `train`, `train_many`, `load_run`, `list_runs`, the `Run` handle
- the app (lab/api/launch.py): `demo`
- TransformerLens's habits (lab/api/cache.py): `Run.run_with_cache`, `Run.run_with_hooks`, `ActivationCache`,
  `Run.hooks`
- the app's analyses as numbers (lab/api/analyses.py): `Run.head_roles`, `Run.patching`, `Run.fourier`,
  `Run.logit_lens`, and (lab/api/presets.py) the presets (`presets`, `preset_configs`, `train_preset`,
  `explain_preset`) and `untrained`
- the export to TransformerLens's HookedTransformer (lab/api/lens_export.py): `to_transformer_lens`
- figures (lab/api/figures.py): `plot_curves`, `plot_bands` (its numbers: `bands_frame`), `plot_attention`,
  `plot_pca`, `plot_importance`, `plot_logit_lens`, `plot_params`

The layer above everything (tests/test_layers.py): it may read any part of the lab, and loads the app
(gradio) only inside `demo()`.
"""
from lab.api.analyses import PatchingGrids
from lab.api.cache import ActivationCache
from lab.api.configs import config_keywords, count_params, make_config, make_grid
from lab.api.figures import (bands_frame, plot_attention, plot_bands, plot_curves, plot_importance,
                             plot_logit_lens, plot_params, plot_pca)
from lab.api.launch import demo
from lab.api.lens_export import to_transformer_lens
from lab.api.presets import PresetRuns, explain_preset, preset_configs, presets, train_preset, untrained
from lab.api.runs import Run, list_runs, load_run, train, train_many
from lab.config import ConfigError, RunConfig

__all__ = [
    "RunConfig", "ConfigError", "make_config", "make_grid", "count_params", "config_keywords",
    "Run", "train", "train_many", "load_run", "list_runs", "demo",
    "ActivationCache", "untrained", "presets", "preset_configs", "train_preset", "explain_preset", "PresetRuns",
    "PatchingGrids", "to_transformer_lens",
    "plot_curves", "plot_bands", "bands_frame", "plot_attention", "plot_pca", "plot_importance", "plot_logit_lens",
    "plot_params",
]
