"""KV-cache groups: which layers share a block table (vLLM's hybrid allocator, simplified).

Layers with the same attention window form a class; each class is cut into groups of `group_size` layers
(the smallest class's size), so that a block of any group is the same number of bytes and every group
draws from one BlockPool. Group g's j-th layer keeps its K/V in cache slot j of whatever block the group's
block table names: the layers of different groups share the cache tensor, not blocks. A sliding-window
group hands back blocks that fell out of its window (the rest of its table then names the null block), so
a Gemma-style model's memory per sequence is bounded by the window for half its layers or more.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers (model indices) whose K/V live in the same blocks; `sliding_window` None is full attention."""

    layer_ids: tuple[int, ...]
    sliding_window: int | None = None

    def first_needed_block(self, num_computed_tokens: int, block_size: int) -> int:
        """Blocks before this one hold no key the token at position `num_computed_tokens` (or later) reads."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1) // block_size


def group_layers(layer_windows: list[int | None]) -> list[KVCacheGroup]:
    """Full-attention groups first, then each window's, in layer order; groups of equal size (the last of a
    class may be smaller: its unused cache slots are padding)."""
    classes: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        classes.setdefault(window, []).append(layer)
    size = min(len(layers) for layers in classes.values())
    order = sorted(classes, key=lambda w: (w is not None, w or 0))
    return [KVCacheGroup(tuple(classes[w][i:i + size]), w) for w in order for i in range(0, len(classes[w]), size)]


def group_size(groups: list[KVCacheGroup]) -> int:
    """Cache slots per block: the largest group's layer count."""
    return max(len(g.layer_ids) for g in groups)
