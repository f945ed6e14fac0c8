"""A token-granular paged KV cache that Hugging Face attention layers write into and read from.

Layout. Every attention layer owns one pool ``[2, 1, num_kv_heads, num_rows, head_dim]`` of
``num_rows = max_num_tokens + 1`` token rows (keys at ``[0]``, values at ``[1]``; heads first, so
that a run of rows is already attention's ``[1, heads, kv_len, head_dim]``), allocated once: the
token budget. A sequence (a *slot*) owns an ordered list of pool rows, one per cached
token, kept on the host by the runner; the same list lives on the device as row ``slot`` of
``slot_table [max_num_seqs + 1, max_model_len + 1]`` (column ``p`` = the pool row of the token at
position ``p``). The last pool row, the last table column and the last table row (the *scratch
slot*, which the padding sequences of a CUDA-graph bucket use) are scratch: padding tokens of a
step write there and nobody reads them.

One step. The runner calls :meth:`PagedKVCache.prepare_step` with, for every padded input token,
the pool row it writes and its table cell, then runs the model with this object as
``past_key_values``. In each layer, :meth:`update` scatters the step's new keys and values into the
pool, then gathers ``[batch_size, kv_len]`` rows through the slot table (one ``index_select`` for
keys and values together), so attention sees each sequence's tokens at their own positions (the
runner's 4-D mask hides the columns past each sequence's length and the stale rows there).

Fast path. When the step has one sequence whose rows are one ascending run of the pool (the
runner hands out and takes back rows in ascending order, so a lone sequence keeps this through
appends and rollbacks), the write is a plain slice copy and the read is a view of the pool: no
index kernels at all.

Paged reads (``read_in_place``, the runner's ``attention_backend="paged"``). :meth:`update`
writes the new keys and values as above and returns the layer's whole pool ``[1, num_kv_heads,
num_rows, head_dim]`` (no gather); attention then reads each sequence's rows through the slot
table itself (:mod:`engine.runner.paged_attention`, set up by the runner's
:func:`~engine.runner.attention_backend.paged_attention_step`). The fast path stays as it is.

Costs. The gather copies the batch's cached keys and values once per layer and step, as
``DynamicCache``'s ``torch.cat`` does; padding to the longest sequence of the batch costs
attention work on masked columns. Rollback and freeing are host list operations (no device work):
a rolled-back row is simply reused by the next token that needs one.

Mask sizes. :meth:`get_query_offset` and :meth:`get_mask_sizes` answer ``transformers``'
``create_causal_mask`` when the runner passes no mask (a step whose sequences all have one length
and one number of new tokens): the queries start at ``query_offset`` and see ``kv_len`` keys.
"""

from __future__ import annotations

import torch

from engine.runner.fused_ops import fits_rotary, runs_here
from engine.runner.kv_write import can_write, write_kv, write_kv_reference
from engine.runner.rotary_write import rotary_write

# How attention reads the cache: "gather" (each sequence's rows copied out, padded, then SDPA
# with a 4-D mask) or "paged" (read in place; engine.config.ATTENTION_BACKENDS lists the same)
ATTENTION_BACKENDS = ("auto", "gather", "paged")


class KVCacheFull(RuntimeError):
    """The token budget cannot hold a step's new tokens; nothing was changed.

    The scheduler frees tokens (preempts a sequence, or waits) and retries.
    """

    def __init__(self, tokens_needed: int, tokens_free: int):
        super().__init__(f"KV cache full: the step needs {tokens_needed} new tokens, "
                         f"{tokens_free} are free")
        self.tokens_needed = tokens_needed
        self.tokens_free = tokens_free


class PagedKVCache:
    """Per-layer token pools plus the device slot table; passed to the model as past_key_values.

    ``layers`` maps each attention module's ``layer_idx`` to the device its layer runs on (a model
    spread by ``device_map="auto"`` keeps each layer's pool next to its weights).
    ``read_in_place``: :meth:`update` returns the whole pool instead of gathering (module
    docstring, "Paged reads").
    """

    is_compileable = False  # read by transformers' mask creation

    def __init__(self, layers: dict[int, torch.device], num_kv_heads: int, head_dim: int,
                 max_num_tokens: int, max_num_seqs: int, max_model_len: int, dtype: torch.dtype,
                 table_device: torch.device, read_in_place: bool = False):
        self.read_in_place = read_in_place
        self.scratch_row = max_num_tokens
        self.max_model_len = max_model_len
        shape = (2, 1, num_kv_heads, max_num_tokens + 1, head_dim)
        # layer_idx -> [2, 1, num_kv_heads, max_num_tokens + 1, head_dim]: keys [0], values [1]
        self.pools = {i: torch.zeros(shape, dtype=dtype, device=dev) for i, dev in layers.items()}
        # layer_idx -> (keys, values), each [1, num_kv_heads, max_num_tokens + 1, head_dim]:
        # views made once, so that a step's per-layer work is as few tensor ops as possible
        self._kv = {i: (p[0], p[1]) for i, p in self.pools.items()}
        # [max_num_seqs + 1, max_model_len + 1] pool row of each (slot, position); the last
        # column and the last row (the scratch slot) are scratch
        self.scratch_slot = max_num_seqs
        self.slot_table = torch.full((max_num_seqs + 1, max_model_len + 1), self.scratch_row,
                                     dtype=torch.long, device=table_device)
        self._devices = sorted({p.device for p in self.pools.values()}, key=str)
        self._write_rows: dict[torch.device, torch.Tensor] = {}  # device -> [batch_size * num_new]
        self._read_rows: dict[torch.device, torch.Tensor] = {}  # device -> [batch_size * kv_len]
        self._run: tuple[int, int] | None = None  # fast path: (first pool row, seq_len before)
        self._query_offset = 0
        self._kv_len = 0

    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys and values one cached token takes over all layers."""
        return sum(p.numel() // p.shape[3] * p.element_size() for p in self.pools.values())

    @property
    def single_device(self) -> bool:
        """All layers' pools and the slot table live on one device."""
        return len(self._devices) == 1 and self._devices[0] == self.slot_table.device

    @property
    def scratch_column(self) -> int:
        """The slot-table column padding tokens write (never read)."""
        return self.max_model_len

    def prepare_step(self, slots: torch.Tensor, write_rows: torch.Tensor,
                     table_cells: torch.Tensor, kv_len: int, query_offset: int = 0,
                     run_start: int | None = None) -> None:
        """Record this step's new tokens in the slot table and fix what each layer reads.

        ``slots [batch_size]``: the step's slots. ``write_rows [batch_size, num_new]``: the pool
        row each padded input token writes (scratch for padding).
        ``table_cells [batch_size * num_new]``: its flat slot-table index
        ``slot * (max_model_len + 1) + position`` (scratch column for padding).
        ``kv_len``: the longest ``seq_len + num_new`` of the batch. ``query_offset``: the first
        new position when every sequence has the same one (only read when the runner passes no
        mask). ``run_start``: for a one-sequence step whose rows ``0 .. kv_len - 1`` are the pool
        rows ``run_start ...`` in order, that first row (fast path); otherwise None.
        """
        self.slot_table.view(-1).index_copy_(0, table_cells, write_rows.view(-1))
        self._kv_len, self._query_offset = kv_len, query_offset
        self._write_rows = {dev: write_rows.reshape(-1).to(dev) for dev in self._devices}
        if run_start is not None:
            self._run = (run_start, kv_len - write_rows.shape[1])
            return
        self._run = None
        if self.read_in_place:  # (attention reads through the slot table itself)
            return
        # [batch_size * kv_len]
        read_rows = self.slot_table.index_select(0, slots)[:, :kv_len].reshape(-1)
        self._read_rows = {dev: read_rows.to(dev) for dev in self._devices}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new ``[batch_size, heads, num_new, head_dim]`` states, return the cached ones.

        Returns keys and values ``[batch_size, num_kv_heads, kv_len, head_dim]`` of every
        sequence of the step in position order (strided views; stale rows past a sequence's
        length are hidden by the runner's mask); with ``read_in_place`` (and off the fast path),
        the layer's whole pools ``[1, num_kv_heads, num_rows, head_dim]`` instead.
        """
        kv = self._kv.get(layer_idx)
        if kv is None:
            raise ValueError(f"layer_idx {layer_idx} has no KV pool (pools: {sorted(self.pools)})")
        keys, values = kv  # each [1, heads, num_rows, head_dim]
        batch_size, num_heads, num_new, head_dim = key_states.shape
        if num_heads != keys.shape[1] or head_dim != keys.shape[3]:
            raise ValueError(f"layer {layer_idx} produced keys with {num_heads} heads of dim "
                             f"{head_dim}; the pool holds {keys.shape[1]} of dim {keys.shape[3]}")
        kv_len = self._kv_len
        write = self._write_rows[keys.device]  # [batch_size * num_new]
        pool = self.pools[layer_idx]
        # (the padding's scratch row may be written several times: it is never read unmasked)
        if can_write(pool, key_states, value_states):  # (one launch: engine/runner/kv_write.py)
            write_kv(pool, key_states, value_states, write)
        elif self._run is not None:  # one sequence on one ascending run of rows: slices
            first, start = self._run
            keys.narrow(2, first + start, num_new).copy_(key_states)
            values.narrow(2, first + start, num_new).copy_(value_states)
        else:
            write_kv_reference(pool, key_states, value_states, write)
        if self._run is not None:  # (its rows read as one slice, no index)
            first, _ = self._run
            return keys.narrow(2, first, kv_len), values.narrow(2, first, kv_len)
        if self.read_in_place:
            return keys, values
        # [2, heads, batch_size, kv_len, head_dim]
        cached = self.pools[layer_idx].index_select(3, self._read_rows[keys.device]).view(
            2, num_heads, batch_size, kv_len, head_dim)
        # -> [batch_size, heads, kv_len, head_dim]
        return cached[0].transpose(0, 1), cached[1].transpose(0, 1)

    def update_rotated(self, query_states: torch.Tensor, key_states: torch.Tensor,
                       value_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Transformers' LLaMA rotary embedding of the queries and keys (``[batch_size, heads,
        num_new, head_dim]``, by ``cos``/``sin [batch_size or 1, num_new, head_dim]``) and
        :meth:`update` of the rotated keys and the values, in one launch
        (:mod:`engine.runner.rotary_write`): ``(rotated queries, keys, values)`` as
        :meth:`update` returns them. Only where attention reads the pools in place and the
        launch takes the tensors (one CUDA device, or Triton's interpreter; the fused rotary's
        dtypes; one dtype; each last dimension contiguous; a lone sequence's slices go through
        :meth:`update`); None otherwise, with nothing done."""
        kv = self._kv.get(layer_idx)
        if not self.read_in_place or self._run is not None or kv is None:
            return None
        pool = self.pools[layer_idx]
        if not (fits_rotary(query_states, key_states, cos, sin) and pool.is_contiguous()
                and runs_here(query_states, key_states, value_states, cos, sin, pool)
                and value_states.shape == key_states.shape and value_states.stride(-1) == 1
                and query_states.dtype == value_states.dtype == pool.dtype
                and key_states.shape[1] == pool.shape[2] and key_states.shape[3] == pool.shape[4]):
            return None
        rotated = rotary_write(query_states, key_states, value_states, cos, sin, pool,
                               self._write_rows[pool.device])
        return rotated, kv[0], kv[1]

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """Position of the step's first new token (steps without a runner mask only)."""
        return self._query_offset

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """(kv_length, kv_offset) of this step's attention (steps without a runner mask only)."""
        return self._kv_len, 0
