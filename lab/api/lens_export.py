"""A trained model as a TransformerLens model (Nanda & Bloom 2022) with the same weights and the same logits, for a
notebook that goes on with TransformerLens's own tools: a `HookedTransformer` under TransformerLens 2.x and 3.x,
a `TransformerBridge` built by `boot_native` (a model from a config alone, no download) under 4.x, which removed
HookedTransformer.

The weights map one to one, by the names this lab's model already gives them (lab/model.py, views of its
parameters), nothing folded or centred:
  - `in_proj`'s rows (Wq, Wk, Wv, each n_heads * d_head by d_model, and their biases) -> per block `attn.W_Q`,
    `W_K`, `W_V` (n_heads, d_model, d_head) and `b_Q`, `b_K`, `b_V` (n_heads, d_head)
  - `out_proj` -> `attn.W_O` (n_heads, d_head, d_model) and `b_O`
  - the feed-forward `fc1` / `fc2` -> `mlp.W_in` (d_model, d_mlp), `b_in`, `W_out` (d_mlp, d_model), `b_out`
  - `Block.norms` -> `ln1` (before attention) and `ln2` (before the feed-forward), `dec_norm` -> `ln_final`
    (`w`, and `b` for LayerNorm); QK-norm's per-head RMSNorms -> `attn.q_norm.w`, `attn.k_norm.w`
  - `tok_emb` -> `embed.W_E` (every token id of the task's vocabulary, the separator included), the learned
    position table -> `pos_embed.W_pos` (n_ctx, d_model), `head` -> `unembed.W_U` with a zero `b_U` (no bias here)

What HookedTransformerConfig expresses exactly, and so is exported: pre-LN or no norms (normalization_type
"LN", "RMS" or None; eps 1e-5 as here), relu or gelu (TransformerLens's "gelu" is the exact erf GELU, as
torch's), attention scaled by sqrt(d_head) or not (use_attn_scale), any d_head, d_ff = 0 (attn_only), learned
positions ("standard"), RoPE ("rotary" over the whole d_head, split halves: rotary_adjacent_pairs=False, base
10000), ALiBi with a power-of-two head count ("alibi": TransformerLens's slopes are 2^(-8k/n), the paper's for
those counts), and QK-norm with RMSNorm (use_qk_norm: an RMSNorm over each head's d_head after hook_q / hook_k,
before the rotation, as here).

Refused, naming the setting and why: post-LN (TransformerLens normalises each sublayer's input, never the sum),
sinusoidal or no positional encoding (no such positional_embedding_type), ALiBi with another head count (the
slopes differ), QK-norm with LayerNorm (TransformerLens's is an RMSNorm), gated feed-forward layers
(TransformerLens's gated MLP has no gate bias and adds b_in after the gating), residual connections off,
encoder-decoder and recurrent models.

TransformerLens 4.x (checked against 4.3.0): `boot_native` builds learned or rotary positions only, so ALiBi is
refused there too, and QK-norm (its config takes `use_qk_norm` and its native attention ignores it). Three
differences from a HookedTransformer, each checked by tests/test_transformer_lens_4x.py:
  - its rotary attention pairs dimensions (2i, 2i+1) whatever `rotary_adjacent_pairs` says, where this lab pairs
    (i, i + d_head/2); the export permutes the d_head axis of W_Q, W_K, b_Q and b_K to [0, h, 1, h+1, ...]
    (h = d_head/2), which leaves every attention score as it is, so the bridge's hook_q, hook_k and W_Q, W_K hold
    this lab's values in that order;
  - without scaling (`scale="none"`) its attention still divides by sqrt(d_head) and refuses a divisor of 1 in
    its config: the export sets each block's divisor to 1 after building it;
  - its `hook_attn_scores` holds the pattern (after the softmax), and `hook_result`, `hook_rot_q/k` and an
    attention-only block's `hook_resid_mid` never fire (`cache.stack_head_results` still computes the heads'
    outputs, from hook_z and W_O).
The export then compares the bridge's logits with this lab's on a random batch and raises if they differ.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import warnings
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import nn

from lab.config import GATED, ConfigError
from lab.model import Transformer
from lab.recurrent import RecurrentLM

if TYPE_CHECKING:  # the optional package, for the annotations only
    from transformer_lens import HookedTransformer

INSTALL = "pip install transformer-lens==3.9.0"  # the version the export is tested against (requirements-dev.txt)


def _refusals(model: Union[Transformer, RecurrentLM], bridge: bool = False) -> list[tuple[str, str]]:
    """(setting, why) for each setting TransformerLens's HookedTransformer (with `bridge`, 4.x's native
    TransformerBridge) cannot compute exactly."""
    if not isinstance(model, Transformer):
        return [("model.arch", f"{model.cfg.arch!r}, a recurrent baseline: TransformerLens builds Transformers only")]
    cfg, out = model.cfg, []
    if cfg.arch != "decoder":
        out.append(("model.arch", f"{cfg.arch!r}: HookedTransformer is decoder-only"))
    if cfg.norm == "post":
        out.append(("model.norm", "'post' (post-LN, LN(x + f(x))): TransformerLens's blocks normalise each "
                                  "sublayer's input (pre-LN, x + f(LN(x))), never the sum"))
    if cfg.pos == "sinusoidal":
        out.append(("model.pos", "'sinusoidal': TransformerLens has no fixed sine/cosine table (its docs: "
                                 "'Sinusoidal are not currently supported'; its 'standard' W_pos is learned)"))
    elif cfg.pos == "none":
        out.append(("model.pos", "'none' (no positional encoding): every TransformerLens positional_embedding_type "
                                 "adds or applies positions"))
    elif cfg.pos == "alibi" and not math.log2(cfg.n_heads).is_integer():
        out.append(("model.pos", f"'alibi' with n_heads = {cfg.n_heads}, not a power of two: TransformerLens's ALiBi "
                                 "slopes are 2^(-8k/n) for every head count, this lab's those of the ALiBi paper, "
                                 "which differ when the count is not a power of two"))
    elif cfg.pos not in ("learned", "rope", "alibi"):
        out.append(("model.pos", f"{cfg.pos!r}: TransformerLens has no such positional_embedding_type"))
    if cfg.qk_norm == "on" and cfg.norm_type != "rmsnorm":
        out.append(("model.qk_norm", f"'on' with norm_type {cfg.norm_type!r}: TransformerLens's QK-norm "
                                     "(use_qk_norm) is an RMSNorm, without centring or bias"))
    if cfg.activation in GATED and cfg.d_ff:
        out.append(("model.activation", f"{cfg.activation!r}: TransformerLens's gated MLP computes "
                                        "act(x W_gate) * (x W_in) + b_in, with no gate bias and the value bias after "
                                        "the product; this lab's fc1 adds both biases before it"))
    if cfg.residual != "on":
        out.append(("model.residual", "'off': TransformerLens's blocks always add to the residual stream"))
    if bridge and cfg.pos == "alibi":
        out.append(("model.pos", "'alibi': TransformerLens 4.x's boot_native model has learned ('standard') and "
                                 "rotary positions only (4.0 removed HookedTransformer's ALiBi with it)"))
    if bridge and cfg.qk_norm == "on":
        out.append(("model.qk_norm", "'on': TransformerLens 4.x's boot_native attention has no QK-norm (its config "
                                     "accepts use_qk_norm and ignores it)"))
    return out


def _eps(model: Transformer) -> float:
    """The norms' eps (1e-5 for LayerNorm and RMSNorm here): HookedTransformerConfig has one for all of them."""
    found = {float(m.eps) for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))}
    if len(found) > 1:
        raise ConfigError("model.norm_type", f"norms with different eps {sorted(found)}: TransformerLens has one eps")
    return found.pop() if found else 1e-5


def lens_config(model: Transformer) -> dict[str, Any]:
    """The HookedTransformerConfig keywords of `model` (TransformerLens's names for its settings)."""
    cfg, weight = model.cfg, model.tok_emb.weight
    # n_ctx: the positions' table's rows (with randomized positions, a learned table holds one per id of the
    # range; at inference, as here, the real positions read its first rows)
    return {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_ctx": model.pos.rows(), "d_head": cfg.d_head,
            "n_heads": cfg.n_heads, "d_mlp": cfg.d_mlp if cfg.d_ff else None, "attn_only": cfg.attn_only,
            "d_vocab": model.vocab_size, "act_fn": cfg.act_fn, "normalization_type": cfg.normalization_type,
            "eps": _eps(model), "use_attn_scale": cfg.scale == "sqrt", "use_attn_result": True,  # hook_result, as here
            "use_qk_norm": cfg.qk_norm == "on", "positional_embedding_type": cfg.positional_embedding_type,
            **({"rotary_dim": cfg.d_head, "rotary_base": 10000, "rotary_adjacent_pairs": False}
               if cfg.pos == "rope" else {}),
            "default_prepend_bos": False, "device": str(weight.device), "dtype": weight.dtype, "seed": None,
            "init_weights": False}  # every parameter is loaded (to_transformer_lens checks)


def lens_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HookedTransformer's parameter names (copies)."""
    sd: dict[str, torch.Tensor] = {"embed.W_E": model.W_E, "unembed.W_U": model.W_U, "unembed.b_U": model.b_U}
    if model.cfg.pos == "learned":
        sd["pos_embed.W_pos"] = model.W_pos
    elif model.cfg.pos == "alibi":  # TransformerLens builds a W_pos for ALiBi too, and never reads it: zeros
        sd["pos_embed.W_pos"] = torch.zeros(model.pos.rows(), model.cfg.d_model, dtype=model.W_E.dtype)
    norms = [(f"blocks.{i}.{name}", getattr(block, name)) for i, block in enumerate(model.blocks)
             for name in ("ln1", "ln2")] + [("ln_final", model.dec_norm)]
    for i, block in enumerate(model.blocks):
        at = f"blocks.{i}."
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            sd[at + "attn." + name] = getattr(block.attn, name)
        if block.mlp is not None:
            for name in ("W_in", "b_in", "W_out", "b_out"):
                sd[at + "mlp." + name] = getattr(block.mlp, name)
        norms += [(at + "attn.q_norm", block.attn.q_norm), (at + "attn.k_norm", block.attn.k_norm)]
    for at, norm in norms:
        if getattr(norm, "weight", None) is not None:
            sd[at + ".w"] = norm.weight
        if getattr(norm, "bias", None) is not None:
            sd[at + ".b"] = norm.bias
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def _installed_major() -> Optional[int]:
    """The installed transformer-lens's major version, None when it is not installed."""
    if importlib.util.find_spec("transformer_lens") is None:
        return None
    try:
        return int(importlib.metadata.version("transformer-lens").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 3  # a source checkout without metadata: try HookedTransformer, which says if it is missing


def _hooked(model: Transformer) -> "HookedTransformer":
    """TransformerLens 2.x/3.x: a HookedTransformer with `model`'s weights."""
    try:  # 4.x raises ImportError here (even for hasattr): it removed HookedTransformer
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as exc:
        raise ImportError(f"to_transformer_lens found no HookedTransformer in the installed transformer-lens: "
                          f"{INSTALL}") from exc
    with warnings.catch_warnings():  # 3.x's notice that 4.0 drops HookedTransformer: the docstring says so
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        lens = HookedTransformer(HookedTransformerConfig(**lens_config(model)))
    missing, unexpected = lens.load_state_dict(lens_state_dict(model), strict=False)
    buffers = {name for name, _ in lens.named_buffers()}
    if unexpected or set(missing) - buffers:
        raise RuntimeError(f"to_transformer_lens: weights that did not map: missing {sorted(set(missing) - buffers)}, "
                           f"unexpected {sorted(unexpected)}")
    return lens.eval()


def halves_to_pairs(d_head: int) -> torch.Tensor:
    """The index `perm` with new[j] = old[perm[j]] = [0, h, 1, h+1, ...] (h = d_head/2): this lab's rotation pairs
    dimensions (i, i + h) (Su et al. 2021 as GPT-NeoX writes it), TransformerLens 4.x's native one (2i, 2i+1)
    (GPT-J's order). Permuting the d_head axis of the queries and the keys alike leaves every score q.k unchanged."""
    h = d_head // 2
    return torch.stack([torch.arange(h), torch.arange(h) + h], dim=-1).flatten()  # (h, 2) -> (d_head,)


def _bridge(model: Transformer) -> Any:
    """TransformerLens 4.x: a TransformerBridge from `boot_native` with `model`'s weights (the module docstring says
    what differs from a HookedTransformer)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    keywords = {**lens_config(model), "use_attn_result": False}  # the bridge's attention never fires hook_result
    rope = model.cfg.pos == "rope"
    if rope:
        keywords["rotary_adjacent_pairs"] = True  # what its native rotation computes (4.3.0 ignores the flag)
    cfg = TransformerBridgeConfig(**keywords)  # the constructor: from_dict drops keys it does not know, silently
    weights = lens_state_dict(model)
    if rope:
        perm = halves_to_pairs(model.cfg.d_head)
        for key in weights:
            if key.endswith((".W_Q", ".W_K", ".b_Q", ".b_K")):  # d_head is the last axis of all four
                weights[key] = weights[key][..., perm].contiguous()
    # boot_native builds float32 on the default device unless told (the config's dtype and device are not applied)
    bridge = TransformerBridge.boot_native(cfg, device=keywords["device"], dtype=keywords["dtype"])
    bridge.load_state_dict(convert_tl_checkpoint(weights, cfg), strict=True)
    if model.cfg.scale != "sqrt":  # its native attention divides by sqrt(d_head) even with use_attn_scale False
        for block in bridge.blocks:
            block.attn.original_component.scale = 1.0
    bridge.eval()
    _same_logits(model, bridge)
    return bridge


def _same_logits(model: Transformer, lens: Any) -> None:
    """Raise unless `lens` gives `model`'s logits on a random batch: the bridge's adaptations above lean on
    TransformerLens's internals, which a later 4.x may change."""
    n = min(8, model.pos.rows())
    tokens = torch.randint(0, model.vocab_size, (2, n), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(model.tok_emb.weight.device)  # (batch 2, pos n)
    was = model.training
    model.eval()
    with torch.no_grad():
        ours, theirs = model(tokens).logits, lens(tokens)
    model.train(was)
    diff = float((ours - theirs).abs().max())
    if diff > 1e-4 * max(1.0, float(ours.abs().max())):
        version = importlib.metadata.version("transformer-lens")
        raise RuntimeError(f"to_transformer_lens: transformer-lens {version} computes other logits than this lab's "
                           f"model (max |difference| {diff:.2e}); the export is tested with 3.9.0 and 4.3.0")


def to_transformer_lens(model: Any) -> Any:
    """A TransformerLens model with `model`'s weights (a lab Transformer, or a `Run`: its trained model), in eval
    mode, on the model's device and dtype: a `HookedTransformer` under transformer-lens 2.x/3.x, a
    `TransformerBridge` under 4.x. Its logits and activations equal this lab's on the same token ids (pass token
    tensors: it has no tokenizer, and prepends no BOS). ConfigError names each setting it cannot express and
    why; ImportError when transformer-lens is missing."""
    if not isinstance(model, (Transformer, RecurrentLM)):
        model = getattr(model, "model", model)  # a Run (lab/api/runs.py): its trained model
    if not isinstance(model, (Transformer, RecurrentLM)):
        raise TypeError(f"to_transformer_lens takes a lab Transformer or a Run, not {type(model).__name__}")
    major = _installed_major()
    refused = _refusals(model, bridge=major is not None and major >= 4)
    if refused:
        raise ConfigError(refused[0][0], "TransformerLens cannot compute this model exactly: "
                          + "; ".join(f"{field} is {why}" for field, why in refused))
    if major is None:
        raise ImportError("to_transformer_lens needs the optional package TransformerLens (tested with 3.9.0 and "
                          f"4.3.0), which is not installed: {INSTALL}")
    assert isinstance(model, Transformer)
    return _bridge(model) if major >= 4 else _hooked(model)
