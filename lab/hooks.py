"""Hook points: the one place where code outside the model reads or replaces an activation of a forward pass.

A `HookPoint` is an identity module placed where an activation is made (TransformerLens's HookPoint, Nanda &
Bloom 2022, which follows Garcon; the shapes and names are TransformerLens's). A hook function gets
(activation, hook point) and returns the activation's replacement, or None to leave it as it is. The model
(lab/model.py) names each of its hook points by TransformerLens's name in `Transformer.hook_dict`; the
notebook API's cache (lab/api/cache.py), the interventions (lab/interventions.py) and activation patching
(lab/circuits/patching.py) all put their functions on these points and take them off after one `with` block.

With no function on it, a hook point costs one attribute test: the model skips the layout changes a hook
would need, and attention keeps its fused kernel unless a hook reads the scores or the pattern.
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterator, Optional, Sequence

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

HookFn = Callable[[Tensor, "HookPoint"], Optional[Tensor]]
_LAYER = re.compile(r"(?:^|\.)(\d+)\.")


class HookPoint(nn.Module):
    """An activation's place in the forward pass: an identity where hook functions read or replace it."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # TransformerLens's name, set by the model that holds it (`name_hook_points`)

    @property
    def active(self) -> bool:
        """Whether any function is on this point (else the model may skip the work a hook would need)."""
        return bool(self._forward_hooks)

    def layer(self) -> Optional[int]:
        """The block this point belongs to (TransformerLens's `hook.layer()`), None outside the blocks."""
        m = _LAYER.search(self.name)
        return int(m.group(1)) if m else None

    def add_hook(self, fn: HookFn) -> RemovableHandle:
        """Put `fn` on: it gets (activation, this point) and returns the replacement or None."""
        return self.register_forward_hook(lambda module, args, out: fn(out, self))

    def forward(self, x: Tensor) -> Tensor:
        return x

    def __call__(self, x: Tensor) -> Tensor:  # the fast path: no function on, no module call
        return super().__call__(x) if self._forward_hooks else x

    def extra_repr(self) -> str:
        return self.name


def name_hook_points(model: nn.Module, rename: Callable[[str], str]) -> dict[str, HookPoint]:
    """Every HookPoint below `model`, by `rename(its module path)`, with that name written into it."""
    points: dict[str, HookPoint] = {}
    for path, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = rename(path)
            points[module.name] = module
    return points


@contextlib.contextmanager
def hooks_on(points: dict[str, HookPoint], fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[None]:
    """Each (name, function) of `fwd_hooks` on its point for the block's duration, taken off however it ends;
    an unknown name raises KeyError listing the first block's points."""
    handles = []
    try:
        for name, fn in fwd_hooks:
            if name not in points:
                first = [n for n, p in points.items() if p.layer() in (None, 0)]
                raise KeyError(f"{name!r} is not a hook point of this model; its points are {', '.join(first)} "
                               "(and the same for every layer)")
            handles.append(points[name].add_hook(fn))
        yield
    finally:
        for h in handles:
            h.remove()
