"""The export to TransformerLens 4.x checked against the real package: `python -m tests.lens_bridge_check` in a
virtual environment whose transformer-lens is a 4.x (tests/test_transformer_lens_4x.py makes one; 3.x and 4.x
cannot share an environment) prints one JSON object that the test reads.

For a learned-position and a rotary model trained a few steps, and for models of the other settings the bridge
expresses perturbed from their initial weights: the notebook of tests/lens_notebook.py on this lab's model and on
the exported TransformerBridge, every number and every activation both caches name compared (to 1e-5, as the
3.9 check does), after the two documented differences (lab/api/lens_export.py): a rotary model's queries and keys
in the bridge's order of dimensions, and the bridge's hook_attn_scores, which holds the pattern. Then the settings
it refuses, with the field each refusal names.
"""
from __future__ import annotations

import importlib.metadata
import json
import sys
import tempfile
from typing import Any

import torch

import lab
from lab.api.lens_export import halves_to_pairs, to_transformer_lens
from tests.lens_notebook import agree, assert_kinds, perturbed, tl_notebook, tokens_for

PERMUTED = ("W_Q", "W_K", "b_Q", "block_W_Q", "attn.hook_q", "attn.hook_k")  # a rotary model's: d_head is the last axis
SETTINGS = [{"norm_type": "rmsnorm"}, {"scale": "none"}, {"norm": "none", "activation": "relu"},
            {"d_ff": 0, "activation": "swiglu"}, {"head_dim": 12, "pos": "rope", "norm_type": "rmsnorm", "scale": "none"},
            {"pos_range": 64}, {"pos": "rope", "pos_range": 64}]
REFUSED = [({"pos": "alibi", "n_heads": 4}, "model.pos"), ({"qk_norm": "on", "norm_type": "rmsnorm", "pos": "rope"},
           "model.qk_norm"), ({"norm": "post"}, "model.norm"), ({"pos": "sinusoidal"}, "model.pos"),
           ({"arch": "lstm"}, "model.arch")]


def as_the_bridge_has_it(name: str, ours: torch.Tensor, cache: Any, rope: bool, d_head: int) -> torch.Tensor:
    """This lab's value of `name` in the form the bridge keeps it (the two documented differences)."""
    if name.endswith("attn.hook_attn_scores"):
        return cache[name.replace("hook_attn_scores", "hook_pattern")]
    if rope and name.endswith(PERMUTED):
        return ours[..., halves_to_pairs(d_head)]
    return ours


def run(model: Any, tokens: torch.Tensor, notebook: bool) -> tuple[dict[str, Any], Any]:
    """The whole notebook, or (for the other settings, as the 3.9 check does) the logits and the cache."""
    if notebook:
        return tl_notebook(model, tokens)
    logits, cache = model.run_with_cache(tokens)
    return {"logits": logits}, cache


def compare(ours: Any, notebook: bool) -> dict[str, Any]:
    """The notebook (`notebook`) or a cached run on both models, to 1e-5 (of the largest value for a perturbed
    model, as the 3.9 check): the names whose values differ (with the message), the cache's names only this lab's
    cache holds, and the number of names compared."""
    theirs = to_transformer_lens(ours)
    rope, d_head, scaled = ours.cfg.positional_embedding_type == "rotary", ours.cfg.d_head, not notebook
    tokens = tokens_for(ours)
    (a, cache_a), (b, cache_b) = run(ours, tokens, notebook), run(theirs, tokens, notebook)
    failed = {}
    for key in a:
        try:
            if key.endswith("_labels"):
                assert a[key] == b[key], (a[key], b[key])
            else:
                agree(as_the_bridge_has_it(key, a[key], cache_a, rope, d_head).float(), b[key].float(), key, scaled)
        except AssertionError as exc:
            failed[key] = str(exc)[:300]
    shared = set(cache_a.keys()) & set(cache_b.keys())
    for name in sorted(shared):
        try:
            agree(as_the_bridge_has_it(name, cache_a[name], cache_a, rope, d_head), cache_b[name], name, scaled)
        except AssertionError as exc:
            failed[name] = str(exc)[:300]
    try:
        assert_kinds(shared, ours)
    except AssertionError as exc:
        failed["kinds"] = str(exc)
    return {"type": type(theirs).__name__, "failed": failed, "compared": len(a) + len(shared),
            "only_ours": sorted(set(cache_a.keys()) - set(cache_b.keys()))}


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, Any] = {"version": importlib.metadata.version("transformer-lens"), "models": {}, "refused": {}}
    with tempfile.TemporaryDirectory() as runs:
        for pos in ("learned", "rope"):  # as the 3.9 check trains them: weights well off their initial values
            trained = lab.train(task="copy", d_model=32, n_heads=2, n_layers=2, d_mlp=64, pos=pos, steps=40, warmup=0,
                            lr=1e-2, batch_size=16, eval_every=40, eval_samples=16, threads=1, runs_dir=runs,
                            progress=False)
            out["models"][f"trained {pos}"] = compare(trained.model, notebook=True)
    for keywords in SETTINGS:
        out["models"][json.dumps(keywords)] = compare(perturbed(**keywords), notebook=False)
    for keywords, field in REFUSED:
        try:
            to_transformer_lens(lab.untrained(**{"task": "copy", **keywords}))
            out["refused"][json.dumps(keywords)] = None
        except lab.ConfigError as exc:
            out["refused"][json.dumps(keywords)] = {"field": exc.field, "expected": field, "message": str(exc)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
