"""A token-granular paged KV cache that Hugging Face attention layers write into and read from.

Layout. Every attention layer owns two pools, keys and values, of ``max_num_tokens + 1`` rows
``[num_rows, num_kv_heads, head_dim]``, allocated once: the token budget. A sequence (a *slot*)
owns an ordered list of pool rows, one per cached token, kept on the host by the runner; the same
list lives on the device as row ``slot`` of ``slot_table [max_num_seqs, max_model_len + 1]``
(column ``p`` = the pool row of the token at position ``p``). The last pool row and the last table
column are scratch: padding tokens of a step write there and nobody reads them.

One step. The runner calls :meth:`PagedKVCache.prepare_step` with, for every padded input token,
the pool row it writes and its table cell, then runs the model with this object as
``past_key_values``. In each layer, :meth:`update` scatters the step's new keys and values into the
pool, then gathers ``[batch_size, kv_len]`` rows through the slot table, so attention sees each
sequence's tokens at their own positions (the runner's 4-D mask hides the columns past each
sequence's length and the stale rows there).

Costs. The gather copies the batch's cached keys and values once per layer and step, as
``DynamicCache``'s ``torch.cat`` does; padding to the longest sequence of the batch costs
attention work on masked columns. Rollback and freeing are host list operations (no device work):
a rolled-back row is simply reused by the next token that needs one.
"""

from __future__ import annotations

import torch


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
    """

    def __init__(self, layers: dict[int, torch.device], num_kv_heads: int, head_dim: int,
                 max_num_tokens: int, max_num_seqs: int, max_model_len: int, dtype: torch.dtype,
                 table_device: torch.device):
        self.scratch_row = max_num_tokens
        self.max_model_len = max_model_len
        shape = (max_num_tokens + 1, num_kv_heads, head_dim)
        # layer_idx -> [max_num_tokens + 1, num_kv_heads, head_dim]
        self.keys = {i: torch.zeros(shape, dtype=dtype, device=dev) for i, dev in layers.items()}
        self.values = {i: torch.zeros(shape, dtype=dtype, device=dev) for i, dev in layers.items()}
        # [max_num_seqs, max_model_len + 1] pool row of each (slot, position); last column scratch
        self.slot_table = torch.full((max_num_seqs, max_model_len + 1), self.scratch_row,
                                     dtype=torch.long, device=table_device)
        self._write_rows: dict[torch.device, torch.Tensor] = {}  # device -> [batch_size * num_new]
        self._read_rows: dict[torch.device, torch.Tensor] = {}  # device -> [batch_size, kv_len]

    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys and values one cached token takes over all layers."""
        return sum(2 * k[0].numel() * k.element_size() for k in self.keys.values())

    @property
    def scratch_column(self) -> int:
        """The slot-table column padding tokens write (never read)."""
        return self.max_model_len

    def prepare_step(self, slots: torch.Tensor, write_rows: torch.Tensor,
                     table_cells: torch.Tensor, kv_len: int) -> None:
        """Record this step's new tokens in the slot table and fix what each layer reads.

        ``slots [batch_size]``: the step's slots. ``write_rows [batch_size * num_new]``: the pool
        row each padded input token writes (scratch for padding).
        ``table_cells [batch_size * num_new]``: its flat slot-table index
        ``slot * (max_model_len + 1) + position`` (scratch column for padding).
        ``kv_len``: the longest ``seq_len + num_new`` of the batch.
        """
        self.slot_table.view(-1).index_copy_(0, table_cells, write_rows)
        # [batch_size, kv_len]
        read_rows = self.slot_table.index_select(0, slots)[:, :kv_len].contiguous()
        devices = {k.device for k in self.keys.values()}
        self._write_rows = {dev: write_rows.to(dev) for dev in devices}
        self._read_rows = {dev: read_rows.to(dev) for dev in devices}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new ``[batch_size, heads, num_new, head_dim]`` states, return the cached ones.

        Returns keys and values ``[batch_size, num_kv_heads, kv_len, head_dim]`` of every
        sequence of the step, gathered in position order (stale rows past a sequence's length are
        hidden by the runner's mask).
        """
        if layer_idx not in self.keys:
            raise ValueError(f"layer_idx {layer_idx} has no KV pool (pools: {sorted(self.keys)})")
        k_pool, v_pool = self.keys[layer_idx], self.values[layer_idx]
        batch_size, num_heads, num_new, head_dim = key_states.shape
        if (num_heads, head_dim) != k_pool.shape[1:]:
            raise ValueError(f"layer {layer_idx} produced keys with {num_heads} heads of dim "
                             f"{head_dim}; the pool holds {tuple(k_pool.shape[1:])}")
        write = self._write_rows[k_pool.device].view(batch_size, num_new)
        read = self._read_rows[k_pool.device]  # [batch_size, kv_len]
        # one strided scatter each: [batch_size, num_new, heads, head_dim] into the pool rows
        k_pool.index_put_((write,), key_states.transpose(1, 2).to(k_pool.dtype))
        v_pool.index_put_((write,), value_states.transpose(1, 2).to(v_pool.dtype))
        flat = read.view(-1)  # [batch_size * kv_len]
        gathered = (batch_size, read.shape[1], num_heads, head_dim)
        # [batch_size, kv_len, heads, head_dim] -> [batch_size, heads, kv_len, head_dim]
        return (k_pool.index_select(0, flat).view(gathered).transpose(1, 2),
                v_pool.index_select(0, flat).view(gathered).transpose(1, 2))
