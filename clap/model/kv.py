"""Key/value cache helpers shared by generation (:mod:`clap.model.generate`) and completion scoring
(:func:`clap.model.base.completion_nll`): the prompt prefix many rows share, and a cache of copies of
its keys and values that grows in place. Light on imports: the base stage imports it too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def shared_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Tokens every row starts with, leaving at least one token of each row to feed after them."""
    if not rows:
        return 0
    return min(len(os.path.commonprefix([list(r) for r in rows])), min(len(r) for r in rows) - 1)


def buffered_cache(prefix: Any, rows: int, capacity: int) -> Any:
    """A cache of ``rows`` copies of ``prefix`` (a one-row cache, or None) that grows in place, in
    buffers of ``capacity`` positions (grown when a forward needs more)."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer

    class BufferedLayer(DynamicLayer):
        """A ``DynamicLayer`` appending into preallocated buffers (views, no per-token concatenation)."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                shape = (key_states.shape[0], key_states.shape[1], capacity, key_states.shape[3])
                self._k, self._v, self._n = key_states.new_empty(shape), value_states.new_empty(shape), 0
            n = self._n + key_states.shape[-2]
            if n > self._k.shape[2]:  # forced-token chunks carry padding: grow (rare) instead of overflowing
                grow = (0, 0, 0, max(n, 2 * self._k.shape[2]) - self._k.shape[2])
                self._k, self._v = (
                    torch.nn.functional.pad(self._k, grow),
                    torch.nn.functional.pad(self._v, grow),
                )
            self._k[:, :, self._n : n] = key_states
            self._v[:, :, self._n : n] = value_states
            self._n = n
            self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]
            return self.keys, self.values

        def batch_select_indices(self, indices):
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    layers = []
    for layer in prefix.layers if prefix is not None else []:
        new = BufferedLayer()
        new.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1))
        layers.append(new)
    return Cache(layers=layers) if layers else Cache(layer_class_to_replicate=BufferedLayer)
