"""The notebook API's side of TransformerLens's habits: the activation cache and running with hooks are the model's
own (lab/activation_cache.py, re-exported here), and `interventions` turns the keywords of `Run.hooks` into
the lab's intervention spec (lab/interventions.py).
"""
from __future__ import annotations

from typing import Any, Iterable

from lab.activation_cache import (SHORT, ActivationCache, HookFn, HookPoint, Tokens, hooked, run_with_cache,
                                  run_with_hooks)
from lab.config import ConfigError
from lab.interventions import (MODES, POSITIONAL, HeadRef, Interventions, LayerRef, parse_heads,
                               parse_layers)
from lab.records import DEC_SELF

__all__ = ["ActivationCache", "HookFn", "HookPoint", "SHORT", "Tokens", "hooked", "run_with_cache", "run_with_hooks",
           "interventions"]


def _heads(heads: Any) -> tuple[HeadRef, ...]:
    """"1.0 1.2", ["1.0", "cross.0.1"] or [(1, 0), (1, 2)] -> HeadRefs (ConfigError naming "Heads")."""
    if isinstance(heads, str):
        return parse_heads(heads)
    out: list[HeadRef] = []
    for h in heads:
        if isinstance(h, HeadRef):
            out.append(h)
        elif isinstance(h, str):
            out.extend(parse_heads(h))
        elif isinstance(h, (tuple, list)) and len(h) == 2 and all(isinstance(x, int) for x in h):
            out.append(HeadRef(DEC_SELF, int(h[0]), int(h[1])))
        else:
            raise ConfigError("Heads", f"{h!r} is not a head (allowed: (layer, head) or 'layer.head' like '1.0')")
    return tuple(sorted(set(out)))


def _layers(layers: Any, label: str) -> tuple[LayerRef, ...]:
    """0, [0, 1], "0,1" or "enc.0" -> LayerRefs (ConfigError naming `label`)."""
    if isinstance(layers, int):
        layers = [layers]
    if isinstance(layers, str):
        return parse_layers(layers, label)
    out: list[LayerRef] = []
    for item in layers if isinstance(layers, Iterable) else [layers]:
        out.extend(parse_layers(str(item), label))
    return tuple(sorted(set(out)))


def interventions(heads: Any = (), mode: str = "zero", skip_attn: Any = (), skip_ff: Any = (),
                  skip_block: Any = (), positional: str = "intact") -> Interventions:
    """The intervention spec `Run.hooks` applies, from its keywords (see there)."""
    if mode not in MODES:
        raise ConfigError("mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if positional not in POSITIONAL:
        raise ConfigError("positional", f"{positional!r} is not one of {', '.join(POSITIONAL)}")
    return Interventions(heads=_heads(heads), mode=mode, skip_attn=_layers(skip_attn, "Skip attention"),
                         skip_ff=_layers(skip_ff, "Skip feed-forward"), skip_block=_layers(skip_block, "Skip block"),
                         positional=positional)
