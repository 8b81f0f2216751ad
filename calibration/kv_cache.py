"""The reference decoders' KV cache: a transformers `Cache` whose layers share one preallocated
buffer, updated by index (docs/decoder.md#kv-cache).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from calibration.model_calls import text_config

__all__ = ["KVCache", "new_cache"]


class _BufferLayer(CacheLayerMixin):
    """Layer `index` of a `KVCache`: the per-layer interface transformers' attention calls.
    Keys and values are views of the shared buffer, not tensors of their own."""

    is_sliding = False
    is_croppable = True
    is_compileable = False
    supports_early_init = False

    def __init__(self, cache: KVCache, index: int):
        # CacheLayerMixin.__init__ would store keys/values tensors: here they are views (below).
        self.cache, self.index = cache, index
        self.length = 0

    @property
    def is_initialized(self) -> bool:
        return self.cache.buffer is not None

    @property
    def keys(self) -> torch.Tensor | None:
        """(b, kv_heads, length, head_dim) view of the buffer."""
        buf = self.cache.buffer
        return None if buf is None else buf[self.index, 0, :, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        buf = self.cache.buffer
        return None if buf is None else buf[self.index, 1, :, :, : self.length]

    def lazy_initialization(self, key_states, value_states) -> None:
        self.cache.reserve(self.length + key_states.shape[-2], key_states)

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the q new keys/values at this layer's length; return views of the filled
        slots, so attention costs O(length), not O(capacity).

        A static-shape step (`KVCache.static_write` set, calibration/static_steps.py): write at
        the index tensor given there with ``index_copy_`` and return views of the window's
        first slots; the length is the caller's to advance (no Python state inside a graph)."""
        static = self.cache.static_write
        if static is not None:
            write, window = static
            buf = self.cache.buffer
            buf[self.index, 0].index_copy_(2, write, key_states)
            buf[self.index, 1].index_copy_(2, write, value_states)
            return buf[self.index, 0, :, :, :window], buf[self.index, 1, :, :, :window]
        start, end = self.length, self.length + key_states.shape[-2]
        buf = self.cache.reserve(end, key_states)
        buf[self.index, 0, :, :, start:end] = key_states
        buf[self.index, 1, :, :, start:end] = value_states
        self.length = end
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows on demand

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected a negative count of tokens to remove, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0


class KVCache(Cache):
    """A transformers `Cache` whose layers share one preallocated tensor, updated by index, as
    gpt-fast keeps its static cache and Medusa's reference code its KV buffer.

    buffer: (layers, 2, b, kv_heads, capacity, head_dim), keys at [:, 0] and values at [:, 1];
    slot s holds the same token in every layer. Allocated at the first write (batch, heads,
    head size, dtype and device from the keys written) with at least `capacity` slots, zeroed
    (a static-shape step's attention reads unwritten slots under a mask, and garbage there
    could be NaN, which a mask does not cancel); a write past the capacity doubles it (one
    copy). `crop(-n)` forgets the last n slots in O(1);
    `keep_slots` and `batch_select_indices` move entries of all layers in one indexing op.
    """

    def __init__(self, num_layers: int, capacity: int = 0):
        self.buffer: torch.Tensor | None = None
        self.min_capacity = int(capacity)
        #: (write index (q,) int64, window): set by a static-shape step around its forward
        self.static_write: tuple[torch.Tensor, int] | None = None
        super().__init__(layers=[_BufferLayer(self, i) for i in range(num_layers)])

    @property
    def length(self) -> int:
        """Filled slots per sequence (of layer 0; all layers agree between forwards)."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.shape[4])

    def reserve(self, slots: int, like: torch.Tensor) -> torch.Tensor:
        """The buffer, allocated (shaped like `like`, (b, kv_heads, *, head_dim)) or grown so
        that it holds at least `slots` slots."""
        if self.buffer is None:
            b, heads, _, head_dim = like.shape
            size = max(slots, self.min_capacity)
            self.buffer = like.new_zeros((len(self.layers), 2, b, heads, size, head_dim))
        elif slots > self.capacity:
            shape = list(self.buffer.shape)
            shape[4] = max(slots, 2 * self.capacity)
            grown = self.buffer.new_zeros(shape)
            filled = max(layer.length for layer in self.layers)
            grown[:, :, :, :, :filled] = self.buffer[:, :, :, :, :filled]
            self.buffer = grown
        return self.buffer

    def keep_slots(self, start: int, slots: torch.Tensor) -> None:
        """Per sequence, slot ``start + j`` takes the entries of slot ``slots[:, j]`` (slots
        (b, k) int64, any slots below the length) in every layer; the length becomes
        ``start + k``. One gather and one copy over the whole buffer: keeping a step's accepted
        path (docs/decoder.md#kv-cache; Medusa's reference code does the same)."""
        n_layers, _, b, heads, _, head_dim = self.buffer.shape
        k = slots.shape[1]
        if b == 1:
            # why: one sequence's slots index one axis; index_select reads them about 3x faster
            # than a gather through a broadcast index (a step's largest cache cost on a CPU)
            kept = self.buffer.index_select(4, slots[0])
        else:
            index = slots[None, None, :, None, :, None].expand(n_layers, 2, b, heads, k, head_dim)
            kept = torch.gather(self.buffer, 4, index)
        self.buffer[:, :, :, :, start : start + k] = kept
        for layer in self.layers:
            layer.length = start + k

    def truncate(self, length: int) -> None:
        """Every layer keeps its first `length` slots per sequence (O(1), nothing moves): a keep
        whose entries are in their slots already (`TreeVerifier.keep`)."""
        for layer in self.layers:
            layer.length = length

    def keep_static(self, write: torch.Tensor, path: torch.Tensor) -> None:
        """`keep_slots` inside a static-shape step (calibration/captured_drafting.py): after a
        step wrote its q entries at `write` (q,) int64, per sequence the slots ``write[j]``,
        j < path's width, take the entries of slot ``write[0] + path[:, j]`` (path (b, k) tree
        indices). All k slots are written whatever the accepted length, so no shape depends on
        it; past it they hold rejected entries, which the validity mask hides until a later
        step overwrites them. The length is the caller's to set, outside the step."""
        n_layers, _, b, heads, _, head_dim = self.buffer.shape
        k = path.shape[1]
        slots = write[0] + path
        if b == 1:
            kept = self.buffer.index_select(4, slots[0])  # why: as in keep_slots, the faster read
        else:
            index = slots[None, None, :, None, :, None].expand(n_layers, 2, b, heads, k, head_dim)
            kept = torch.gather(self.buffer, 4, index)
        self.buffer.index_copy_(4, write[:k], kept)

    def expanded(self, repeats: int, extra: int, scratch: KVCache | None = None) -> KVCache:
        """A cache in which rows ``i * repeats .. i * repeats + repeats - 1`` each hold a copy of
        sequence i's filled slots, with room for `extra` more slots per row: one copy over the
        whole buffer. Batch expansion gives every candidate sequence its own context
        (docs/decoder.md#candidate-sequence-verification).

        `scratch`: a cache returned by an earlier call, whose buffer is reused when it has the
        rows and room (else replaced, its slots doubled as `reserve` does), as an engine reuses
        its preallocated blocks: a fresh allocation per step would add the page faults of
        touching new memory to the copy (docs/decoder.md#candidate-sequence-verification)."""
        n_layers, two, b, heads, _, head_dim = self.buffer.shape
        filled = self.length
        out = scratch if scratch is not None else KVCache(len(self.layers))
        rows_shape = (n_layers, two, b * repeats, heads)
        old = out.buffer
        same_rows = old is not None and tuple(old.shape[:4]) == rows_shape and old.dtype == self.buffer.dtype
        if not same_rows or old.shape[4] < filled + extra or old.device != self.buffer.device:
            slots = max(filled + extra, 2 * old.shape[4] if same_rows else 0)
            out.buffer = self.buffer.new_zeros((*rows_shape, slots, head_dim))
        capacity = out.buffer.shape[4]
        rows = out.buffer.view(n_layers, two, b, repeats, heads, capacity, head_dim)
        rows[..., :filled, :] = self.buffer[:, :, :, None, :, :filled]
        for layer in out.layers:
            layer.length = filled
        return out

    def take_rows(self, source: KVCache, rows: torch.Tensor, count: int) -> None:
        """Per sequence i, the `count` slots after the filled ones take the entries of `source`'s
        row ``rows[i]`` at the same slots (rows (b,) int64), in every layer; the length grows
        by `count`. Writes a chosen candidate's new entries back
        (docs/decoder.md#candidate-sequence-verification)."""
        start = self.length
        self.reserve(start + count, source.buffer[0, 0])
        self.buffer[:, :, :, :, start : start + count] = source.buffer[:, :, rows, :, start : start + count]
        for layer in self.layers:
            layer.length = start + count

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the sequences `indices` (the cache's batch order), all layers at once."""
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(2, indices.to(self.buffer.device))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


def new_cache(model, capacity: int = 0) -> KVCache:
    """An empty `KVCache` for `model` (full-attention layers), holding `capacity` slots per
    sequence without reallocating (0: as many as the first forward writes, then doubling).
    Pass it to the model's forward by `model_calls.cache_kwargs` (`cache`, or `past_key_values`
    before transformers 5.24); batch, heads, dtype and device come
    from the first keys written."""
    return KVCache(int(text_config(model).num_hidden_layers), capacity)
