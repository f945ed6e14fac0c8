"""What a step does for the samples under a grammar (``SamplingParams.structured_outputs``).

Before the proposal, :func:`forced_drafts` asks each decoding sample's grammar for the tokens it
forces (``{"name": "`` after ``{`` in a JSON Schema's object); they are drafted with certainty
and a proposer whose drafts are free (n-gram) continues after them, from the context with them
appended (a model proposer is not asked for that sample in that step). After the proposal,
:func:`prepend_forced` puts them before the proposer's drafts; once the forward is launched (on
a GPU the host works while it runs), :func:`mask_positions` walks each such sample's drafts
through its grammar and keeps the token mask of each verified position (a refused draft stays:
``samplers.structured.walk_drafts`` says why that is lossless). At verification
:func:`mask_rows` applies the masks to the target's adjusted logits, before temperature, top-k/p
and the verification sampler, so that accepted, recovered and bonus tokens all follow the masked
target distribution; at commit the engine advances each matcher by the tokens it kept.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.step_records import SeqStep
from samplers import MAX_SPEC_LEN
from samplers.structured import Grammars, apply_bitmask, walk_drafts


def forced_drafts(items: list[SeqStep], limit: int, max_model_len: int,
                  spare: int | None) -> dict[int, list[int]]:
    """The forced tokens of each decoding item under a grammar (index -> tokens), at most
    ``limit`` each, within the context length, the request's ``max_tokens`` and ``spare``
    KV rows over the whole step (None: no limit)."""
    forced: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        seq = item.seq
        if (seq.grammar is None or not item.samples or item.num_context_tokens != 1
                or limit <= 0):
            continue
        room = max_model_len - seq.num_tokens
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        if spare is not None:
            room = min(room, spare)
        tokens = seq.grammar.forced_tokens(min(limit, room, MAX_SPEC_LEN))
        if tokens:
            forced[i] = tokens
            if spare is not None:
                spare -= len(tokens)
    return forced


def prepend_forced(items: list[SeqStep], forced: dict[int, list[int]], vocab_size: int,
                   device: torch.device, max_drafts: int, max_model_len: int) -> None:
    """Put each item's forced tokens before its proposer drafts (in place; with one-hot rows
    where the proposer gave probabilities), at most ``max_drafts`` in all (and
    ``MAX_SPEC_LEN``) and none past the context length."""
    for i, head in forced.items():
        item = items[i]
        item.forced = len(head)
        room = min(MAX_SPEC_LEN, max_drafts, max_model_len - item.seq.num_tokens)
        item.drafts = (head + item.drafts)[:room]
        if item.draft_probs is not None:  # (forced drafts are certain: one-hot rows)
            item.draft_probs = torch.cat([one_hot(head, vocab_size, device),
                                          item.draft_probs])[:len(item.drafts)]
        item.depth = min(item.depth, len(item.drafts) - item.forced)
        if item.backed is not None:
            item.backed = min(item.backed, item.depth)


def mask_positions(items: list[SeqStep], grammars: Grammars) -> None:
    """Walk each sampling grammar item's drafts through its grammar and keep the mask of every
    verified position (``SeqStep.grammar_mask``)."""
    todo = [item for item in items if item.samples and item.seq.grammar is not None]
    if todo:
        _, masks = walk_drafts([item.seq.grammar for item in todo],
                               [item.drafts for item in todo], grammars.batcher)
        for item, mask in zip(todo, masks, strict=True):
            item.grammar_mask = mask


def mask_rows(logits: torch.Tensor, items: list[SeqStep]) -> None:
    """Apply the grammar masks of ``items`` (the sampling ones, in row order: each has
    ``len(drafts) + 1`` rows of ``logits [num_rows, vocab_size]``) in place."""
    rows: list[int] = []
    masks: list[torch.Tensor] = []
    row = 0
    for item in items:
        n = len(item.drafts) + 1
        if item.grammar_mask is not None:
            rows.extend(range(row, row + n))
            masks.append(item.grammar_mask)
        row += n
    if masks:  # (numpy's concatenation: see walk_drafts)
        apply_bitmask(logits, torch.from_numpy(np.concatenate([m.numpy() for m in masks])),
                      rows)


def one_hot(tokens: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """float32 ``[len(tokens), vocab_size]``: a certain draft's distribution per token."""
    rows = torch.zeros(len(tokens), vocab_size, dtype=torch.float32, device=device)
    rows[torch.arange(len(tokens), device=device),
         torch.tensor(tokens, dtype=torch.long, device=device)] = 1.0
    return rows
