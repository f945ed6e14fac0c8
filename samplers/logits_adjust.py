"""Per-position logits adjustments that need a request's token history.

Applied to the raw logits of every position the target scores, and to the draft model's logits
through ``ProposeRequest.adjust_logits``, *before* temperature / top-k / top-p / min-p. A position
that follows drafts ``d_1..d_j`` sees the history ``prompt + output + d_1..d_j``, exactly the one it
would have if those drafts are accepted, so target and draft distributions are both the ones plain
decoding would use and verification stays lossless.

Order (vLLM V1's), for a row whose output so far is ``out`` (``len(out)`` tokens):

1. ``allowed_token_ids``: every other token gets ``-inf``.
2. ``bad_words``: each word is tokenized with and without a leading space; a one-token word is
   always ``-inf``; a longer one bans its last token when the history ends with the others.
3. ``min_tokens``: while ``len(out) < min_tokens``, EOS (unless ``ignore_eos``) and
   ``stop_token_ids`` get ``-inf``.
4. ``logit_bias``: ``logits[t] += bias[t]``.
5. Penalties: repetition (tokens of prompt + out: ``l / r`` if ``l > 0`` else ``l * r``), then
   frequency and presence over ``out``: ``l -= frequency * count(t) + presence * [count(t) > 0]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers.metadata import host_to_device
from samplers.sampling_params import SamplingParams


def tokenize_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """Token sequences to ban: each word alone and after a space, duplicates removed."""
    seqs: list[list[int]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if ids and ids not in seqs:
                seqs.append(ids)
    return seqs


class LogitsAdjuster:
    """One sample's adjustments; :attr:`active` is False when it has none (the fast path)."""

    def __init__(self, params: SamplingParams, prompt_token_ids: Sequence[int],
                 eos_token_ids: frozenset[int], tokenizer: Any) -> None:
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.bad_word_seqs = tokenize_bad_words(tokenizer, params.bad_words or [])
        masked = set(params.stop_token_ids)
        if not params.ignore_eos:
            masked |= set(eos_token_ids)
        self.min_tokens_ids = sorted(masked) if params.min_tokens > 0 else []
        self.active = bool(params.allowed_token_ids is not None or self.bad_word_seqs
                           or self.min_tokens_ids or params.logit_bias or params.needs_penalties)
        # a bad word of several tokens bans its last one after the others: the adjustment
        # reads the tokens before the position, which only the host has
        self.needs_history = any(len(seq) > 1 for seq in self.bad_word_seqs)
        self._cache: dict[tuple[int, torch.device], dict[str, torch.Tensor]] = {}
        self._dense: dict[tuple[int, torch.device], dict[str, torch.Tensor]] = {}

    def check_sampleable(self, vocab_size: int) -> str | None:
        """Why no token could ever be sampled (every allowed id banned), or None."""
        if self.params.allowed_token_ids is None:
            return None  # bad words are finite sequences: they cannot ban a whole vocabulary
        allowed = {t for t in self.params.allowed_token_ids if t < vocab_size}
        allowed -= {seq[0] for seq in self.bad_word_seqs if len(seq) == 1}
        if allowed and not allowed <= set(self.min_tokens_ids):
            return None
        return ("allowed_token_ids leaves no token that bad_words and min_tokens (which masks EOS "
                "and stop_token_ids) do not ban")

    def _tensors(self, vocab_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Dense masks for one vocabulary size and device, built once."""
        key = (vocab_size, device)
        if key not in self._cache:
            p = self.params
            t: dict[str, torch.Tensor] = {}
            if p.allowed_token_ids is not None:
                ids = [i for i in p.allowed_token_ids if i < vocab_size]
                mask = torch.ones(vocab_size, dtype=torch.bool, device=device)  # [vocab_size]
                mask[torch.tensor(ids, dtype=torch.long, device=device)] = False
                t["disallowed"] = mask
            if p.logit_bias:
                items = [(i, b) for i, b in p.logit_bias.items() if i < vocab_size]
                t["bias_ids"] = torch.tensor([i for i, _ in items], dtype=torch.long, device=device)
                t["bias_values"] = torch.tensor([b for _, b in items], dtype=torch.float32,
                                                device=device)
            if self.min_tokens_ids:
                t["min_tokens_ids"] = torch.tensor(
                    [i for i in self.min_tokens_ids if i < vocab_size], dtype=torch.long,
                    device=device)
            if p.repetition_penalty != 1.0:
                prompt = torch.tensor(self.prompt_token_ids, dtype=torch.long, device=device)
                in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
                in_prompt[prompt[prompt < vocab_size]] = True  # [vocab_size]
                t["in_prompt"] = in_prompt
                # (a tensor, not a Python number: CUDA divides by a number as a product with
                # its reciprocal, which can differ in the last bit from a division by a tensor:
                # samplers.slot_adjustments divides by each row's own)
                t["repetition"] = torch.tensor(p.repetition_penalty, dtype=torch.float32,
                                               device=device)
            self._cache[key] = t
        return self._cache[key]

    def dense_rows(self, vocab_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        """This sample's adjustments that need no history, as rows over the vocabulary (for
        per-slot state on the device, :mod:`samplers.slot_adjustments`), each present only
        where the sample has it: ``banned [vocab_size]`` bool (outside ``allowed_token_ids``,
        a one-token bad word), ``min_tokens [vocab_size]`` bool (what ``min_tokens`` masks),
        ``bias [vocab_size]`` float32 (-0.0 where none: ``x + -0.0`` is ``x`` for every
        ``x``, a negative zero included), ``in_prompt [vocab_size]`` bool (repetition
        penalty), and ``scales [3]`` float32 (repetition, frequency, presence). Made on the
        host and copied through pinned memory: a copy from pageable memory would wait for
        the work queued on the device."""
        key = (vocab_size, device)
        if key not in self._dense:
            p = self.params
            rows: dict[str, torch.Tensor] = {}
            one_token = [seq[0] for seq in self.bad_word_seqs
                         if len(seq) == 1 and seq[0] < vocab_size]
            if p.allowed_token_ids is not None or one_token:
                banned = torch.zeros(vocab_size, dtype=torch.bool)
                if p.allowed_token_ids is not None:
                    banned.fill_(True)
                    banned[[i for i in p.allowed_token_ids if i < vocab_size]] = False
                banned[one_token] = True
                rows["banned"] = banned
            if self.min_tokens_ids:
                masked = torch.zeros(vocab_size, dtype=torch.bool)
                masked[[i for i in self.min_tokens_ids if i < vocab_size]] = True
                rows["min_tokens"] = masked
            if p.logit_bias:
                items = [(i, b) for i, b in p.logit_bias.items() if i < vocab_size]
                bias = torch.full((vocab_size,), -0.0, dtype=torch.float32)
                bias[[i for i, _ in items]] = torch.tensor([b for _, b in items],
                                                           dtype=torch.float32)
                rows["bias"] = bias
            if p.repetition_penalty != 1.0:
                in_prompt = torch.zeros(vocab_size, dtype=torch.bool)
                in_prompt[[t for t in self.prompt_token_ids if t < vocab_size]] = True
                rows["in_prompt"] = in_prompt
            rows["scales"] = torch.tensor(
                [p.repetition_penalty, p.frequency_penalty, p.presence_penalty],
                dtype=torch.float32)
            device = torch.device(device)
            pinned = device.type == "cuda"
            self._dense[key] = {name: (t.pin_memory() if pinned else t).to(device,
                                                                           non_blocking=True)
                                for name, t in rows.items()}
        return self._dense[key]

    def apply(self, logits: torch.Tensor, output_token_ids: Sequence[int],
              drafts: Sequence[int] = ()) -> torch.Tensor:
        """Adjust in place ``logits [len(drafts) + 1, vocab_size]``: row ``j`` follows
        ``output_token_ids + drafts[:j]``. Returns ``logits``."""
        if not self.active:
            return logits
        p = self.params
        num_rows, vocab_size = logits.shape
        if num_rows != len(drafts) + 1:
            raise ValueError(f"logits has {num_rows} rows, expected len(drafts) + 1 = "
                             f"{len(drafts) + 1}")
        t = self._tensors(vocab_size, logits.device)
        neg_inf = float("-inf")
        if "disallowed" in t:
            logits.masked_fill_(t["disallowed"], neg_inf)
        if self.bad_word_seqs:
            history = self.prompt_token_ids + list(output_token_ids) + list(drafts)
            base = len(history) - len(drafts)
            for seq in self.bad_word_seqs:
                last, head = seq[-1], seq[:-1]
                if last >= vocab_size:
                    continue
                for j in range(num_rows):
                    end = base + j
                    if not head or (end >= len(head) and history[end - len(head):end] == head):
                        logits[j, last] = neg_inf
        if self.min_tokens_ids:
            ids = t["min_tokens_ids"]  # (on the device: a host list as an index is a copy that
            # waits for the queued work, an overlapped step's forward)
            rows = max(0, min(num_rows, p.min_tokens - len(output_token_ids)))
            if rows and ids.numel():
                logits[:rows, ids] = neg_inf
        if "bias_ids" in t:
            logits[:, t["bias_ids"]] += t["bias_values"]
        if p.needs_penalties:
            self._apply_penalties(logits, output_token_ids, drafts, t)
        return logits

    def _apply_penalties(self, logits: torch.Tensor, output_token_ids: Sequence[int],
                         drafts: Sequence[int], t: dict[str, torch.Tensor]) -> None:
        p = self.params
        num_rows, vocab_size = logits.shape
        device = logits.device
        # (copied without waiting for the queued work: an overlapped step's forward)
        out = host_to_device([i for i in output_token_ids if i < vocab_size], torch.long, device)
        counts = torch.bincount(out, minlength=vocab_size).to(torch.float32)  # [vocab_size]
        counts = counts.expand(num_rows, vocab_size).clone()  # [num_rows, vocab_size]
        if drafts:
            d = host_to_device(list(drafts), torch.long, device)
            one_hot = torch.zeros(num_rows, vocab_size, dtype=torch.float32, device=device)
            one_hot[torch.arange(1, num_rows, device=device), d.clamp(max=vocab_size - 1)] = (
                (d < vocab_size).to(torch.float32))
            counts += one_hot.cumsum(dim=0)  # row j counts drafts d_1..d_j
        seen = counts > 0  # [num_rows, vocab_size]
        if p.repetition_penalty != 1.0:
            r = t["repetition"]
            penalized = seen | t["in_prompt"]
            scaled = torch.where(logits > 0, logits / r, logits * r)
            logits.copy_(torch.where(penalized, scaled, logits))
        if p.frequency_penalty != 0.0:
            logits -= p.frequency_penalty * counts
        if p.presence_penalty != 0.0:
            logits -= p.presence_penalty * seen.to(torch.float32)

    def adjust_prefix(self, prefix_token_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """The proposers' hook: adjust ``logits [vocab_size]`` of the position after
        ``prefix_token_ids`` (prompt + output + drafts so far). Returns a new tensor."""
        if not self.active:
            return logits
        output = list(prefix_token_ids[len(self.prompt_token_ids):])
        row = logits.reshape(1, -1).to(torch.float32).clone()
        return self.apply(row, output).reshape(logits.shape)


def penalized(x: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor | None,
              scales: torch.Tensor) -> torch.Tensor:
    """Rows ``x [n, vocab_size]`` (float32, changed in place where it can) with their
    penalties: ``counts [n, vocab_size]`` float32 each row's output tokens, ``in_prompt [n,
    vocab_size]`` its prompt's (None: no row has a repetition penalty) and ``scales [n, 3]``
    (repetition, frequency, presence). A row without one of them has its neutral value (1, 0,
    0), which changes no bit. The same values as :meth:`LogitsAdjuster.apply`'s."""
    r, f, pres = scales[:, 0:1], scales[:, 1:2], scales[:, 2:3]  # [n, 1] each
    seen = counts > 0
    if in_prompt is not None:
        x = torch.where(seen | in_prompt, torch.where(x > 0, x / r, x * r), x)
    x -= f * counts
    x -= pres * seen.to(torch.float32)
    return x
