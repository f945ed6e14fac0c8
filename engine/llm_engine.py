"""The step loop: schedule -> propose -> one target forward -> adjust -> verify -> append + stop.

One :meth:`LLMEngine.step`:

1. The scheduler picks the running sequences (decodes, prefill chunks) and admits newcomers.
2. Every sequence that samples this step gets its seeded stream reset to ``step_seed`` and asks
   the proposer for up to k drafts (k for the step from :mod:`engine.draft_policy`).
3. ONE target forward scores everything: prefill chunks, and for each sampling sequence its
   uncached tokens followed by its drafts; the logits of the last ``len(drafts) + 1`` positions
   of each sampling sequence are kept. ``KVCacheFull`` preempts the most recently admitted
   sequence and retries (:mod:`scheduler.scheduler`).
4. Penalties, bias, allowed ids, bad words and min-tokens masking are applied to each kept row
   with the history that position has (:mod:`engine.logits_adjust`).
5. The sampler verifies all drafts at once; accepted tokens and the recovered or bonus token are
   appended one by one with stop checks (:func:`engine.stop_checker.append_until_stop`).
6. The target cache is cut back to the kept context (the newest token stays uncached); the
   proposer learns the kept length; finished sequences leave at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.draft_policy import DraftPolicy
from engine.engine_setup import EngineComponents, build_components
from engine.kv_cache import KVCacheFull
from engine.metrics import MetricsCollector
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.stop_checker import append_until_stop
from proposers.base import ProposeRequest
from samplers import INVALID_TOKEN_ID
from samplers.logits_processing import process_logits
from samplers.metadata import SpecDecodeMetadata
from samplers.sampling_tensors import SamplingTensors
from scheduler import ScheduledRequest, Scheduler


@dataclass
class _StepBatch:
    """The sequences of one forward and their drafts (``probs[i]``: ``[len(drafts[i]),
    vocab_size]`` rows or None)."""

    items: list[ScheduledRequest]
    drafts: list[list[int]] = field(default_factory=list)
    probs: list[torch.Tensor | None] = field(default_factory=list)
    verified_at: float = 0.0  # perf_counter() when verification returned (0: no verification)


class LLMEngine:
    """Continuous-batching speculative decoding over one target model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts: EngineComponents = build_components(config)
        self.model, self.tokenizer = parts.model, parts.tokenizer
        self.runner, self.proposer, self.sampler = parts.runner, parts.proposer, parts.sampler
        self.greedy_sampler = parts.greedy_sampler
        self.device = parts.device
        self.vocab_size = parts.vocab_size
        self.max_model_len = parts.max_model_len
        self.eos_token_ids = parts.eos_token_ids
        spec = config.speculative_config
        max_k = spec.num_speculative_tokens if spec is not None and self.proposer else 0
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens)
        self.metrics = MetricsCollector(max_k)
        self.drafts = DraftPolicy(spec, max_k, self.max_model_len, self.metrics)
        self.requests: dict[str, list[Request]] = {}
        self._finished_outside_step: list[Request] = []
        if config.seed is not None:
            torch.manual_seed(config.seed)

    # ------------------------------------------------------------------ requests
    def check_params(self, params: SamplingParams) -> None:
        """Raise ``ValueError`` when ``params`` names token ids outside the vocabulary."""
        params.verify_vocab(self.vocab_size)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams) -> list[Request]:
        """Queue the ``params.n`` samples of one prompt. A request that cannot run (empty prompt,
        prompt too long, ids outside the vocabulary) finishes at once with ``error`` set."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = time.perf_counter()
        seqs = [Request(request_id, i, prompt, prompt_token_ids, params, self.tokenizer,
                        self.eos_token_ids, now) for i in range(params.n)]
        for seq in seqs:
            seq.acceptance = self.drafts.new_tracker()
        self.requests[request_id] = seqs
        self.metrics.num_requests += 1
        error = self._request_error(prompt_token_ids, params)
        if error is None:
            error = seqs[0].adjuster.check_sampleable(self.vocab_size)
        for seq in seqs:
            if error is not None:
                seq.finish("error", error=error)
                self._finished_outside_step.append(seq)
                continue
            if seq.seed is not None:
                seq.generator = torch.Generator(device=self.device)
            self.scheduler.add(seq)
        return seqs

    def _request_error(self, prompt_token_ids: list[int], params: SamplingParams) -> str | None:
        if len(prompt_token_ids) == 0:
            return "the prompt is empty: at least one token is needed"
        if len(prompt_token_ids) >= self.max_model_len:
            return (f"the prompt has {len(prompt_token_ids)} tokens; max_model_len is "
                    f"{self.max_model_len}, which leaves no room for output")
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
        try:
            params.verify_vocab(self.vocab_size)
        except ValueError as exc:
            return str(exc)
        return None

    def abort_request(self, request_id: str) -> None:
        """Stop every unfinished sample of a request now (``finish_reason='abort'``)."""
        for seq in self.requests.get(request_id, []):
            if not seq.is_finished:
                self._release(seq)
                seq.finish("abort")
                self._finished_outside_step.append(seq)

    def pop_request(self, request_id: str) -> list[Request]:
        """Forget a finished request and return its samples."""
        return self.requests.pop(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def has_work(self) -> bool:
        """True while a step can still run something or report something."""
        return self.scheduler.has_unfinished or bool(self._finished_outside_step)

    def _release(self, seq: Request) -> None:
        """Take a sequence out of the queues, the KV cache and the proposer."""
        self.scheduler.finish(seq)
        if seq.slot is not None:
            self.runner.free_slot(seq.slot)
            seq.slot = None
        if self.proposer is not None:
            self.proposer.remove(seq.seq_id)

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one engine step; return the sequences that got tokens or finished."""
        start = time.perf_counter()
        updated, self._finished_outside_step = self._finished_outside_step, []
        self.drafts.begin_step(self.scheduler.running)
        free_kv_tokens = self._free_kv_tokens()
        plan = self.scheduler.schedule(self.drafts.num_spec_tokens, free_kv_tokens)
        for seq in plan.admitted:
            seq.slot = self.runner.allocate_slot()
        if not plan.scheduled:
            updated += self._fail_unschedulable()
            return updated
        self.drafts.fill_padding(plan.scheduled, free_kv_tokens)  # (admission allocates no rows)
        batch = _StepBatch(plan.scheduled)
        propose_s, num_draft_steps = self._propose(batch)
        target_start = time.perf_counter()
        logits = self._forward(batch)
        if logits is not None:
            updated += self._verify_and_append(batch, logits)
        target_s = time.perf_counter() - target_start
        if batch.verified_at:
            self.drafts.record_step(batch.items, batch.drafts, batch.verified_at - target_start)
        self.metrics.record_step(time.perf_counter() - start, propose_s, target_s,
                                 num_draft_steps)
        return updated

    def _free_kv_tokens(self) -> int | None:
        free = getattr(self.runner, "num_free_tokens", None)
        return free() if callable(free) else free

    def _fail_unschedulable(self) -> list[Request]:
        """Nothing runs and the next waiting sequence does not fit the KV cache: fail it."""
        if not self.scheduler.waiting:
            return []
        seq = self.scheduler.waiting.popleft()
        seq.finish("error", error=f"the KV cache cannot hold this request's {seq.num_tokens} "
                                  "tokens; raise kv_cache_tokens")
        return [seq]

    def _propose(self, batch: _StepBatch) -> tuple[float, int]:
        """Reset the seeded streams of the sampling sequences and collect their drafts."""
        for item in batch.items:
            seq = item.request
            if item.samples and seq.generator is not None:
                seq.generator.manual_seed(seq.step_seed())
        batch.drafts = [[] for _ in batch.items]
        batch.probs = [None for _ in batch.items]
        wanted = [i for i, item in enumerate(batch.items) if item.num_spec_tokens > 0]
        if not wanted or self.proposer is None:
            return 0.0, 0
        start = time.perf_counter()
        proposal = self.proposer.propose([
            ProposeRequest(seq.seq_id, seq.all_token_ids, batch.items[i].num_spec_tokens,
                           seq.params, seq.generator,
                           seq.adjuster.adjust_prefix if seq.adjuster.active else None)
            for i in wanted for seq in [batch.items[i].request]])
        keep = self.drafts.kept_drafts([batch.items[i] for i in wanted], proposal)
        offset = 0
        for i, proposed, k in zip(wanted, proposal.draft_token_ids, keep, strict=True):
            batch.drafts[i] = list(proposed)[:k]
            if proposal.draft_probs is not None:
                batch.probs[i] = proposal.draft_probs[offset:offset + len(batch.drafts[i])]
            offset += len(proposed)
        return time.perf_counter() - start, max(len(d) for d in proposal.draft_token_ids)

    def _forward(self, batch: _StepBatch) -> torch.Tensor | None:
        """One target forward over the batch; on ``KVCacheFull`` preempt and retry.
        None when preemption emptied the batch."""
        while batch.items:
            slots, tokens, logits_indices = [], [], []
            offset = 0
            for item, drafts in zip(batch.items, batch.drafts, strict=True):
                seq = item.request
                start = seq.num_computed_tokens
                new = seq.all_token_ids[start:start + item.num_context_tokens] + drafts
                slots.append(seq.slot)
                tokens.append(new)
                if item.samples:
                    logits_indices.extend(range(offset + len(new) - len(drafts) - 1,
                                                offset + len(new)))
                offset += len(new)
            try:
                return self.runner.forward(slots, tokens, logits_indices)
            except KVCacheFull:
                self._preempt_one(batch)
        return None

    def _fail_non_finite(self, logits: torch.Tensor, drafts: list[list[int]]) -> set[int]:
        """Requests (indices into ``drafts``) with a NaN, +inf or all -inf logits row, off CUDA.

        Their rows are zeroed so that the others verify; the caller fails them alone. On CUDA
        the kernels mark such a request with ``INVALID_TOKEN_ID`` instead, without a sync.
        """
        if logits.device.type == "cuda":
            return set()
        finite = torch.isfinite(logits.amax(dim=1))  # [num_rows]
        if bool(finite.all()):
            return set()
        bad, row = set(), 0
        for i, d in enumerate(drafts):
            rows = slice(row, row + len(d) + 1)
            if not bool(finite[rows].all()):
                bad.add(i)
                logits[rows] = 0.0
            row = rows.stop
        return bad

    def _preempt_one(self, batch: _StepBatch) -> None:
        """Preempt the most recently admitted sequence (recomputed later); a sequence that does
        not fit even alone fails with an error."""
        victim = self.scheduler.running[-1]
        if len(self.scheduler.running) == 1:
            self._release(victim)
            victim.finish("error", error="the KV cache cannot hold this request alone; raise "
                                         "kv_cache_tokens or lower max_model_len")
            self._finished_outside_step.append(victim)
        else:
            if self.proposer is not None:
                self.proposer.remove(victim.seq_id)
            self.runner.free_slot(victim.slot)
            self.scheduler.preempt()
            self.metrics.num_preemptions += 1
        keep = [i for i, item in enumerate(batch.items) if item.request is not victim]
        batch.items = [batch.items[i] for i in keep]
        batch.drafts = [batch.drafts[i] for i in keep]
        batch.probs = [batch.probs[i] for i in keep]

    def _verify_and_append(self, batch: _StepBatch, logits: torch.Tensor) -> list[Request]:
        updated = []
        for item in batch.items:
            if not item.samples:
                item.request.num_computed_tokens += item.num_context_tokens
        sampling_idx = [i for i, item in enumerate(batch.items) if item.samples]
        if not sampling_idx:
            return updated
        seqs = [batch.items[i].request for i in sampling_idx]
        drafts = [batch.drafts[i] for i in sampling_idx]
        row = 0
        for seq, d in zip(seqs, drafts, strict=True):
            if seq.adjuster.active:
                seq.adjuster.apply(logits[row:row + len(d) + 1], seq.output_token_ids, d)
            row += len(d) + 1
        bad = self._fail_non_finite(logits, drafts)
        metadata = SpecDecodeMetadata.from_lists(drafts, self.device)
        sampling = SamplingTensors.from_params([s.params for s in seqs],
                                               [s.generator for s in seqs], self.device)
        probs = [batch.probs[i] for i, d in zip(sampling_idx, drafts, strict=True) if d]
        draft_probs = None
        if any(p is not None for p in probs):
            draft_probs = torch.cat(probs)  # [num_tokens, vocab_size]
        need_logprobs = any(s.params.logprobs is not None for s in seqs)
        logprob_logits = logits.clone() if need_logprobs else None
        sampler = self.sampler
        if self.greedy_sampler is not None and sampling.all_greedy:
            sampler = self.greedy_sampler  # the argmax match, without the probability work
        tokens = sampler.verify(logits, metadata, sampling, draft_probs).tolist()
        batch.verified_at = time.perf_counter()  # forward + verify done (synchronised)
        logprob_rows = (torch.log_softmax(process_logits(
            logprob_logits, sampling, [len(d) + 1 for d in drafts]), dim=-1)
            if need_logprobs else None)
        row = 0
        for i, (seq, d, out) in enumerate(zip(seqs, drafts, tokens, strict=True)):
            first, row = row, row + len(d) + 1  # this request's logits rows
            if i in bad or (out and out[0] == INVALID_TOKEN_ID):  # (-2: the CUDA kernels' mark)
                seq.finish("error", error="non-finite target logits (NaN/inf) or a draft id "
                           "outside the vocabulary at verification")
                self._release(seq)
                updated.append(seq)
                continue
            new_tokens = [t for t in out if t >= 0]
            num_accepted = len(new_tokens) - 1
            old_num_tokens = seq.num_tokens
            kept = append_until_stop(seq, new_tokens, self.eos_token_ids, self.max_model_len)
            if logprob_rows is not None and seq.logprobs is not None:
                seq.add_logprobs(logprob_rows[first:first + kept], new_tokens[:kept])
            self._account(seq, len(d), num_accepted, kept)
            if seq.is_finished:
                self._release(seq)
            else:
                seq.num_computed_tokens = seq.num_tokens - 1
                self.runner.truncate(seq.slot, seq.num_computed_tokens)
                if d and self.proposer is not None:
                    self.proposer.on_accepted(seq.seq_id, old_num_tokens + min(num_accepted, kept))
            updated.append(seq)
        return updated

    def _account(self, seq: Request, num_drafted: int, num_accepted: int, kept: int) -> None:
        now = time.perf_counter()
        m = seq.metrics
        m.num_drafted += num_drafted
        m.num_accepted += num_accepted
        m.num_steps += 1
        m.num_generated += kept
        if m.first_token_time is None:
            m.first_token_time = now
        if seq.is_finished:
            m.finished_time = now
        self.drafts.update(seq, num_drafted, num_accepted)
        self.metrics.record_request_step(num_drafted, num_accepted, kept)
