"""Multi-step draft model: a small causal LM guesses k tokens, one batched forward per token.

Each step, for every request that wants drafts (Leviathan et al., arXiv 2211.17192, §2.3):

1. *Catch up.* The draft keeps its own KV cache per request (a slot of its own
   :class:`~proposers.base.DraftRunner`, the engine's model runner) and remembers which token
   ids it holds. The cache is cut back to the longest prefix it shares with the request's context
   (verification rejected the drafts after it; no recomputation), and the context tokens it lacks,
   usually the recovered or bonus token plus the last accepted draft, are fed in one ragged forward
   over the whole batch, whose last row gives the first draft's logits.
2. *Draft.* Draft ``j`` is drawn from those logits; every request still short of its own k feeds
   its draft ``j`` in the next one-token batched forward. Draft k is never fed (it is fed on the
   next step if accepted), so a step costs k forwards and leaves ``context + k - 1`` tokens cached.

Drawing a draft (``greedy=False``, vLLM's ``draft_sample_method="probabilistic"``): the logits are
brought to the target's width (zero probability past the draft's own vocabulary), passed through
the request's ``adjust_logits`` with the prefix that position has (context + drafts so far), then
through ``samplers.logits_processing.logits_to_probs`` with the request's own parameters; the
token is the exponential race ``argmax(p / q)``, ``q ~ Exp(1)`` from the proposer's generator, so
it is drawn from exactly the returned row ``p`` (one-hot at the argmax for a temperature-0
request). A seeded request's draft at output position ``t`` is instead the keyed Gumbel-max
sample of ``p`` with the noise the target's token at ``t`` is drawn with
(``samplers.keyed_random``): still a draw from ``p``, and *coupled* to the target's, so that the
draft is accepted whenever both distributions' races pick the same token.
With ``greedy=True`` the draft is the argmax of the adjusted logits and no probabilities are
returned (one-hot drafts).

A step whose draft forward does not fit the draft's KV budget stops drafting there: the requests
keep the drafts made so far, which is always safe.

The engine builds the runner (``ProposerContext.make_runner``): the draft forwards run exactly as
the target's do, CUDA graphs included.

*On the device* (``drafts_on_device``: overlapped drafting steps, ``engine.overlap``). Where a
request's drafts are argmax drafts (``greedy=True``, or a temperature-0 request: its drawn draft
is the argmax too), the draft model drafts the next step from a verification still on the device
(:meth:`DraftModelProposer.draft_after`): one forward feeds each request's verified tokens after
its fed token (``width`` of them: the ones past the accepted drafts and the recovered or bonus
token are placeholders, written past the context where the next step overwrites them before
anything reads there), the row of the recovered or bonus token gives the first draft, and each
draft but the last is fed in a one-token forward, all positions computed on the device
(``DraftRunner.forward_fed``). The host learns only at the commit how far the request got
(:meth:`~DraftModelProposer.advance`): the cache then holds the context's first ``valid``
tokens, whose ids it has not read; the next host proposal trusts them. A slot keeps the rows it
reserved past its context until a host proposal or a rejection cuts it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from proposers.base import (
    DraftForward,
    DraftRunner,
    Proposal,
    Proposer,
    ProposerContext,
    ProposeRequest,
)
from proposers.registry import register_proposer
from proposers.vocab import check_shared_vocab
from samplers.greedy import argmax_tokens
from samplers.keyed_random import keyed_sample, seed_key
from samplers.logits_processing import logits_to_probs
from samplers.sampling_tensors import SamplingTensors


@dataclass
class _DraftSeq:
    slot: int
    # token ids held in the slot, in order; None after drafting on the device: the slot then
    # holds the context's first ``valid`` tokens (ids not read on the host)
    cached: list[int] | None = field(default_factory=list)
    valid: int = 0
    on_device: bool = False  # its drafts are argmax drafts: they may be made on the device
    # the slot lacks context tokens (a catch-up that did not fit the KV budget, or a drafting
    # step from the device that wrote nothing): drafts from the device are token 0 until a
    # catch-up from the host fits, and the commits leave the bookkeeping as it is
    stale: bool = False


class DraftModelProposer(Proposer):
    """Drafts with the model behind ``runner`` (already vocabulary-checked); see the module
    docstring.

    ``target_vocab_size``: the width of the target's logits, that of the returned probabilities
    (default: the draft's own). ``greedy``: argmax drafts without probabilities.
    ``generator``: what requests without a seed draw from (None: torch's global RNG).
    """

    drafts_on_device = True
    adjusts_drafts = True  # (draft_after's argmax is of the draft's logits unadjusted)

    def __init__(self, runner: DraftRunner, greedy: bool = False,
                 target_vocab_size: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        if target_vocab_size is not None and (isinstance(target_vocab_size, bool) or not (
                isinstance(target_vocab_size, int) and target_vocab_size >= 1)):
            raise ValueError(f"target_vocab_size={target_vocab_size!r} is invalid: allowed None "
                             "or an integer >= 1")
        self.runner = runner
        self.greedy = greedy
        self.vocab_size = target_vocab_size or self.runner.vocab_size
        self.generator = generator
        self._seqs: dict[str | int, _DraftSeq] = {}

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        drafts: list[list[int]] = [[] for _ in requests]
        step_probs: list[tuple[dict[int, int], torch.Tensor]] = []  # per draft index j
        active = [i for i, r in enumerate(requests) if r.num_spec_tokens > 0]
        feeds = [self._catch_up(requests[i]) for i in active]
        while active:
            slots = [self._seqs[requests[i].req_id].slot for i in active]
            last_rows = np.cumsum([len(f) for f in feeds]) - 1
            if sum(len(f) for f in feeds) > self.runner.num_free_tokens:
                break  # the draft's KV budget is full: keep the drafts made so far
            # [n, draft_vocab]
            logits = self.runner.forward(slots, feeds, last_rows.tolist()).logits
            for i, feed in zip(active, feeds, strict=True):
                seq = self._seqs[requests[i].req_id]
                seq.cached.extend(feed)
                seq.stale = False  # (its context is in: caught up at the first forward)
            tokens, probs = self._draw([requests[i] for i in active],
                                       [drafts[i] for i in active], logits)
            if probs is not None:
                step_probs.append(({i: row for row, i in enumerate(active)}, probs))
            for i, token in zip(active, tokens, strict=True):
                drafts[i].append(token)
            active = [i for i in active if len(drafts[i]) < requests[i].num_spec_tokens]
            feeds = [[drafts[i][-1]] for i in active]
        # (temperature 0: the drawn drafts are the argmax, one-hot: no probabilities needed)
        one_hot = self.greedy or all(r.sampling_params.temperature == 0.0 for r in requests)
        return Proposal(drafts, None if one_hot else self._flatten(drafts, step_probs))

    def on_accepted(self, req_id: str | int, num_tokens: int) -> None:
        seq = self._seqs.get(req_id)
        if seq is not None and seq.cached is None:  # (cut back at the next catch-up)
            seq.valid = min(seq.valid, num_tokens)
        elif seq is not None and num_tokens < len(seq.cached):
            self.runner.truncate(seq.slot, num_tokens)
            del seq.cached[num_tokens:]

    def ready_on_device(self, req_id: str | int, num_tokens: int) -> bool:
        """:meth:`Proposer.ready_on_device`: a request proposed for from the host once, whose
        drafts are argmax drafts (:meth:`flush` brings its cache up to the context)."""
        seq = self._seqs.get(req_id)
        return seq is not None and seq.on_device

    def flush(self, req_ids: Sequence[str | int], contexts: Sequence[Sequence[int]]) -> None:
        """:meth:`Proposer.flush`: each request's whole context into its cache (the tokens it
        lacks, fed in one ragged forward)."""
        seqs, feeds = [], []
        for req_id, context in zip(req_ids, contexts, strict=True):
            seq = self._seqs[req_id]
            feed = self._cut_back(seq, context, len(context))
            if feed:
                seqs.append(seq)
                feeds.append(feed)
        if not feeds or sum(len(f) for f in feeds) > self.runner.num_free_tokens:
            return  # (none missing; or no rows for them: the requests stay stale)
        self.runner.forward([seq.slot for seq in seqs], feeds, [0])  # (one logits row)
        for seq, feed in zip(seqs, feeds, strict=True):
            seq.cached.extend(feed)
            seq.stale = False

    def draft_after(self, req_ids: Sequence[str | int], features: torch.Tensor | None,
                    tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int], steps: int) -> torch.Tensor:
        """:meth:`Proposer.draft_after`: argmax drafts ``[batch, steps]`` (see the module
        docstring). Request ``b``'s verified tokens ``tokens[b]`` go at positions ``base[b] +
        1 ...``; the draft after its newest, at ``base[b] + accepted[b] + 1``, is the first.
        Where a draft's position would pass ``max_model_len`` the last draft is repeated, and
        where the cache has no rows for the forwards, or a request's cache lacks context tokens
        (``stale``), every draft is token 0 and nothing is written: the requests stay (or
        become) stale until a catch-up from the host (any drafts are exact: verification
        decides)."""
        runner = self.runner
        seqs = [self._seqs[req_id] for req_id in req_ids]
        slots = [seq.slot for seq in seqs]
        batch, width = tokens.shape
        # (rows the forwards may take: positions up to base_hi + width + steps - 1)
        needed = sum(max(0, hi + width + steps - runner.seq_len(slot))
                     for slot, hi in zip(slots, base_hi, strict=True))
        if needed > runner.num_free_tokens or any(seq.stale for seq in seqs):
            for seq in seqs:
                seq.stale = True
            return torch.zeros((batch, steps), dtype=torch.long, device=tokens.device)
        out = runner.forward_fed(slots, tokens.clamp_min(0), base + 1, [hi + 1 for hi in base_hi])
        drafts = [self._argmax(out).view(batch, width).gather(1, accepted[:, None])]  # [b, 1]
        newest = base + accepted + 1  # [batch] the newest verified token's position
        for i in range(1, steps):  # (draft i at position newest + i, at most base_hi + width + i)
            highest = [hi + width + i for hi in base_hi]
            if max(highest) >= runner.max_model_len:  # (and every later one: repeat the last)
                break
            out = runner.forward_fed(slots, drafts[-1], newest + i, highest)
            drafts.append(self._argmax(out)[:, None])
        drafts += [drafts[-1]] * (steps - len(drafts))
        return torch.cat(drafts, dim=1)

    def advance(self, req_id: str | int, length: int, features: torch.Tensor | None, row: int,
                token: int) -> None:
        """:meth:`Proposer.advance`: the context is now ``length + 1`` tokens, all in the cache
        (the newest was fed by :meth:`draft_after`; not where it wrote nothing: stale)."""
        seq = self._seqs.get(req_id)
        if seq is not None and not seq.stale:
            seq.cached, seq.valid = None, length + 1

    def _argmax(self, out: DraftForward) -> torch.Tensor:
        """Each logits row's argmax within the target's vocabulary, ``[rows]`` (a row the
        graph marked invalid: token 0)."""
        argmax = out.argmax
        if argmax is None or self.runner.vocab_size > self.vocab_size:
            argmax = argmax_tokens(out.logits[:, :self.vocab_size])
        return argmax.clamp_min(0)

    def remove(self, req_id: str | int) -> None:
        seq = self._seqs.pop(req_id, None)
        if seq is not None:
            self.runner.free_slot(seq.slot)

    def _catch_up(self, request: ProposeRequest) -> list[int]:
        """Cut the request's cache back to what its context confirms; return the tokens to feed.

        At least the last context token is fed: its logits give the first draft.
        """
        seq = self._seqs.get(request.req_id)
        if seq is None:
            seq = self._seqs[request.req_id] = _DraftSeq(self.runner.allocate_slot())
        seq.on_device = self.greedy or request.sampling_params.temperature == 0.0
        return self._cut_back(seq, request.token_ids, len(request.token_ids) - 1)

    def _cut_back(self, seq: _DraftSeq, context: Sequence[int], limit: int) -> list[int]:
        """Cut the slot back to the longest prefix of ``context`` it holds, at most ``limit``
        tokens (and the rows reserved past it); return the context tokens it lacks (the
        request is stale until they are fed)."""
        if seq.cached is None:  # (drafted on the device: its first `valid` are the context's)
            seq.cached = list(context[:seq.valid])
        # (never more than the rows held: a rejection may have cut below what a drafting step
        # on the device wrote, before the commit's advance)
        held = self.runner.seq_len(seq.slot)
        keep = min(_common_prefix(seq.cached, context, limit), held)
        if keep < held:
            self.runner.truncate(seq.slot, keep)
        del seq.cached[keep:]
        feed = list(context[keep:])
        seq.stale = bool(feed)
        return feed

    def _draw(self, requests: list[ProposeRequest], drafts: list[list[int]],
              logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """One draft per request from ``logits [n, draft_vocab]``; and its probabilities."""
        logits = self._to_target_width(logits)  # [n, vocab_size]
        for b, request in enumerate(requests):
            if request.adjust_logits is not None:
                prefix = list(request.token_ids) + drafts[b]
                logits[b] = request.adjust_logits(prefix, logits[b])
        if self.greedy:
            return logits.argmax(dim=-1).tolist(), None
        sampling = SamplingTensors.from_params([r.sampling_params for r in requests], None,
                                               logits.device)
        probs = logits_to_probs(logits, sampling, [1] * len(requests))  # [n, vocab_size]
        # Exponential race argmax(p / q), q ~ Exp(1), from the proposer's generator; greedy
        # rows are one-hot: whatever their q, the race returns their argmax.
        q = torch.ones_like(probs)  # [n, vocab_size]
        sampled = [not g for g in sampling.greedy]
        keyed = [b for b, (s, r) in enumerate(zip(sampled, requests, strict=True))
                 if s and r.seed is not None]
        if len(keyed) < sum(sampled):
            q.exponential_(generator=self.generator)
        tokens = (probs / q.clamp_min_(torch.finfo(q.dtype).tiny)).argmax(dim=-1)  # [n]
        if keyed:  # (seeded requests: the keyed sample at the draft's output position)
            keys = [(*seed_key(requests[b].seed), (requests[b].position + len(drafts[b]))
                     & 0xFFFFFFFF) for b in keyed]
            lo, hi, position = torch.tensor(keys, device=probs.device).unbind(1)
            rows = torch.tensor(keyed, device=probs.device)
            tokens[rows] = keyed_sample(torch.log(probs[rows]), lo, hi, position)
        return tokens.tolist(), probs

    def _to_target_width(self, logits: torch.Tensor) -> torch.Tensor:
        """``[n, vocab_size]``, a fresh tensor (the runner's output is an inference tensor)."""
        width = logits.shape[1]
        if width >= self.vocab_size:
            return logits[:, :self.vocab_size].clone()
        return nn.functional.pad(logits, (0, self.vocab_size - width), value=float("-inf"))

    def _flatten(self, drafts: list[list[int]],
                 step_probs: list[tuple[dict[int, int], torch.Tensor]]) -> torch.Tensor:
        """``[num_tokens, vocab_size]``: each request's draft rows in order, requests in order."""
        if not step_probs:
            return torch.empty(0, self.vocab_size, device=self.runner.device)
        bases = np.cumsum([0] + [p.shape[0] for _, p in step_probs[:-1]])
        order = [int(bases[j]) + step_probs[j][0][i]
                 for i, d in enumerate(drafts) for j in range(len(d))]
        stacked = torch.cat([p for _, p in step_probs])  # [sum of step sizes, vocab_size]
        return stacked.index_select(0, torch.tensor(order, device=stacked.device))


def _common_prefix(cached: list[int], context: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``cached`` and ``context``, at most ``limit``."""
    n = min(len(cached), limit)
    if n <= 0:
        return 0
    if cached[:n] == list(context[:n]):
        return n
    differ = np.flatnonzero(np.asarray(cached[:n]) != np.asarray(context[:n]))
    return int(differ[0])


@register_proposer("draft_model", needs_kv_cache=True)
def build_draft_model(config: Any, ctx: ProposerContext) -> DraftModelProposer:
    """``SpeculativeConfig.model`` (a name or path, or a loaded model with ``tokenizer``), which
    must share the target's vocabulary; ``draft_sample_method``."""
    model, tokenizer = config.model, config.tokenizer
    if isinstance(model, str):
        model, tokenizer = ctx.load_model(model)
    elif tokenizer is None:
        raise ValueError("SpeculativeConfig.tokenizer=None is invalid: the draft model's "
                         "tokenizer is required with an already-loaded draft model")
    width = model.get_output_embeddings().weight.shape[0]
    check_shared_vocab(tokenizer, ctx.target_tokenizer, width)
    return DraftModelProposer(ctx.make_runner(model), config.draft_sample_method == "greedy",
                              ctx.vocab_size, ctx.generator)
