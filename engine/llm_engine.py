"""The step loop: schedule -> propose -> forward -> verify -> commit -> learn.

One :meth:`LLMEngine.step`, each stage taking and returning values (``engine.step_records``):

1. **schedule**: the speculation controller plans the drafts per sequence
   (:mod:`scheduler.speculation`); the scheduler picks the running sequences (decodes, prefill
   chunks) and admits newcomers.
2. **propose**: the proposer drafts for the sequences given drafts; the controller trims a free
   proposer's drafts with its evidence, the KV cache's spare rows cut the rest; trees are pruned
   (:mod:`engine.draft_trees`).
3. **forward**: ONE target forward scores everything: prefill chunks, and for each sampling
   sequence its uncached tokens followed by its drafts; the logits of the last
   ``len(drafts) + 1`` positions of each sampling sequence are kept. ``KVCacheFull`` preempts
   the most recently admitted sequence and retries.
4. **verify**: penalties, bias, allowed ids, bad words and min-tokens masking per kept row
   (:mod:`samplers.logits_adjust`), then the sampler verifies all drafts at once (a seeded
   request by its keyed samples, :mod:`samplers.keyed_random`).
5. **commit**: accepted tokens and the recovered or bonus token are appended with stop checks
   (:func:`engine.stop_checker.append_until_stop`); each running sequence's cache is cut back to
   its kept context, the proposer learns what was kept (and a draft head gets the features);
   finished sequences leave.
6. **learn**: the controller learns the step's outcome (on a GPU during the next step's
   forward, where the host would wait anyway).

**Overlapped steps** (``EngineConfig.async_scheduling``, :mod:`engine.overlap`): a step whose
sequences all decode plainly samples ahead, its tokens left on the device, and a chain step of
a proposer that drafts on the device (the draft head) verifies ahead, the head drafting the next
step there; the next step is launched from those before they are read, and the step is
committed (5-6) while the device runs the next. Other drafting steps (drafts from the host)
take the stages above in one call.

The module holds the request API and the six stages; the overlapped steps' launch and commit
are :class:`engine.flight_steps.OverlappedSteps`, and what the stages compute that needs no
engine state lives beside it: ``engine.step_records`` (the values), ``engine.overlap``,
``engine.forward_inputs``, ``engine.draft_trees``, ``engine.draft_features`` and
``engine.request_checks``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

import torch

from engine.builder import EngineComponents, build_components
from engine.config import EngineConfig
from engine.draft_features import feature_updates
from engine.draft_trees import TREE_MAX_SEQS, keep_trees, tree_depth, tree_ok, verify_trees
from engine.flight_commit import FAILED_ROW, account
from engine.flight_steps import OverlappedSteps
from engine.forward_inputs import forward_inputs, non_finite_rows
from engine.grammar_steps import GrammarMasks, forced_drafts, one_hot, prepend_forced
from engine.logprobs import to_values
from engine.metrics import MetricsCollector
from engine.overlap import InFlight, Pending, TokenCopies
from engine.prefix_caching import attach_hits, leaving_tokens, prefix_hit
from engine.request_checks import check_sampling_params, request_error
from engine.runner.cuda_graphs import batch_bucket
from engine.runner.kv_cache import KVCacheFull
from engine.sequence import Sequence
from engine.step_records import Forwarded, Proposed, SeqStep, Verified, step_outcome
from engine.stop_checker import append_until_stop
from proposers import ProposeRequest
from samplers import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID, SamplingParams, SamplingTensors
from samplers.greedy import GreedyChains
from samplers.keyed_graphs import KeyedGraphs
from samplers.logits_processing import process_logits
from samplers.metadata import SpecDecodeMetadata
from samplers.sampled_chains import SampledChains
from samplers.slot_adjustments import SlotAdjustments
from samplers.structured import Grammars, GrammarState
from scheduler import DraftPlan, Scheduler, StepOutcome, make_controller, within_spare


class LLMEngine(OverlappedSteps):
    """Continuous-batching speculative decoding over one target model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts: EngineComponents = build_components(config)
        self.model, self.tokenizer = parts.model, parts.tokenizer
        self.runner, self.proposer, self.sampler = parts.runner, parts.proposer, parts.sampler
        self.greedy_sampler = parts.greedy_sampler
        self.keep_hidden = self.proposer is not None and self.proposer.needs_features
        # (a draft head reads the target's features at every prompt position: a cache hit
        # computes none, so prefix caching serves engines without one; docs/design.md)
        self.prefix_caching = config.enable_prefix_caching and not self.keep_hidden
        if config.enable_prefix_caching and self.keep_hidden:
            logging.getLogger("specdec").warning(
                "enable_prefix_caching is off with method=%r: its draft head reads the target's "
                "features at every prompt position, which a cache hit does not compute",
                config.speculative_config.method)
        self.device = parts.device
        # the host waits for the device at verification, so work put between a forward's launch
        # and that wait is free (a GPU; on CPU the forward runs in the call)
        self.forward_is_async = self.device.type == "cuda"
        self.vocab_size = parts.vocab_size
        self.max_model_len = parts.max_model_len
        self.eos_token_ids = parts.eos_token_ids
        self.generator = parts.generator
        self.grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_token_ids)
        # (the walk in a worker thread where the host waits for the forward anyway)
        self.grammar_masks = GrammarMasks(self.grammars, self.device, self.forward_is_async)
        self.max_model_len_source = parts.max_model_len_source
        spec = config.speculative_config
        max_k = spec.num_speculative_tokens if spec is not None and self.proposer else 0
        # drafts a grammar step verifies, forced ones included: a speculative method's k (its
        # steps' width, which CUDA graphs are captured for), else the forced-token budget
        self.max_grammar_drafts = max_k or config.structured_forced_tokens
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens)
        self.metrics = MetricsCollector(max_k)
        self.controller = make_controller(
            spec, max_k, self.max_model_len,
            drafts_are_free=bool(self.proposer and self.proposer.drafts_are_free),
            measured_draft_cost=lambda: self.metrics.draft_cost_ratio,
            batch_bucket=batch_bucket,  # (steps of one graph bucket cost the same)
            packed_rows=self.runner.packed_rows)
        self.requests: dict[str, list[Sequence]] = {}
        self._finished_outside_step: list[Sequence] = []
        self._outcome: StepOutcome | None = None  # a step's outcome the controller has not seen
        self._proposed_last_step = False  # (a proposal after a gap catches up: not timed)
        self._unobserved = 0  # steps since the proposer last saw the contexts (_observe)
        # overlapped plain steps (engine.overlap): on by default where the forward runs behind
        # the host (CUDA); the runner must take tokens on the device (not tensor parallel)
        self.overlap = (config.async_scheduling if config.async_scheduling is not None
                        else self.forward_is_async)
        self.overlap = self.overlap and getattr(self.runner, "takes_fed_tokens", False)
        # the most drafts a drafting flight's chains hold for the next step (the configured
        # k), of which that step verifies what the controller chooses then (device_width)
        self.max_chain_drafts = max_k
        # (a drafting flight copies max_k + 1 tokens a sequence)
        self._token_copies = (TokenCopies(self.device, config.max_num_seqs * (max_k + 1))
                              if self.overlap else None)
        # a launched step not yet committed (Pending: not yet sampled either)
        self._in_flight: InFlight | Pending | None = None
        # the adjustments of flights' samples that need no history, kept a slot on the device
        self.slot_adjustments = SlotAdjustments(self.vocab_size, self.device,
                                                self.runner.to_device)
        self._planned: DraftPlan | None = None  # the next step's plan, made while in flight
        # batch size -> the sampling tensors of that many greedy requests (drafting flights)
        self._greedy_sampling: dict[int, SamplingTensors] = {}
        # a drafting flight's greedy verification as one launch of a CUDA graph (its three
        # kernels' host time is on the critical path of an overlapped step: samplers.greedy)
        self._greedy_chains = (
            GreedyChains(self.greedy_sampler, KeyedGraphs(self.device))
            if self.overlap and self.greedy_sampler is not None and self.device.type == "cuda"
            and self.runner.graphs is not None else None)
        # a flight's sampling where requests sample (filters, random draws, the verification
        # kernels: up to about 40 launches) as one launch of a CUDA graph a layout
        self._sampled_chains = (
            SampledChains(self.sampler, KeyedGraphs(self.device, generators=[
                g for g in (self.generator,) if g is not None]), self.generator)
            if self.overlap and self.device.type == "cuda" and self.runner.graphs is not None
            else None)

    # ------------------------------------------------------------------ requests
    def check_params(self, params: SamplingParams) -> None:
        """:func:`check_sampling_params` against this engine's vocabulary and tokenizer."""
        check_sampling_params(params, self.vocab_size, self.tokenizer, self.grammars)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, together: bool = False) -> list[Sequence]:
        """Queue the ``params.n`` samples of one prompt. A request that cannot run (empty prompt,
        prompt too long, ids outside the vocabulary) finishes at once with ``error`` set.
        ``together``: its caller waits for every request it adds this way before it returns
        (``LLM.generate``), so speculation weighs the batch's end (``scheduler.spec_policy``)."""
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        now = time.perf_counter()
        seqs = [Sequence(request_id, i, prompt, prompt_token_ids, params, self.tokenizer,
                         self.eos_token_ids, now) for i in range(params.n)]
        for seq in seqs:
            seq.speculation = self.controller.new_tracker(seq, together)
        self.requests[request_id] = seqs
        self.metrics.num_requests += 1
        error = request_error(prompt_token_ids, params, self.vocab_size, self.max_model_len,
                              self.max_model_len_source)
        if error is None:
            error = seqs[0].adjuster.check_sampleable(self.vocab_size)
        if error is None and params.structured_outputs is not None:
            try:
                compiled = self.grammars.compile(params.structured_outputs)
            except ValueError as exc:
                error = str(exc)
            else:
                for seq in seqs:
                    seq.grammar = GrammarState(compiled, self.vocab_size)
        for seq in seqs:
            if error is not None:
                self.controller.release(seq)
                seq.finish("error", error=error)
                self._finished_outside_step.append(seq)
                continue
            self.scheduler.add(seq)
        return seqs

    def abort_request(self, request_id: str) -> None:
        """Stop every unfinished sample of a request now (``finish_reason='abort'``)."""
        for seq in self.requests.get(request_id, []):
            if not seq.is_finished:
                self._release(seq)
                seq.finish("abort")
                self._finished_outside_step.append(seq)
        self._forget_finished_flight()

    def pop_request(self, request_id: str) -> list[Sequence]:
        """Forget a finished request and return its samples."""
        return self.requests.pop(request_id)

    def discard_request(self, request_id: str) -> None:
        """Abort whatever of a request is unfinished and forget it, so that no later step runs
        or reports any of it (a no-op for a request the engine does not hold)."""
        for seq in self.requests.pop(request_id, []):
            if not seq.is_finished:
                self._release(seq)
                seq.finish("abort")
        self._finished_outside_step = [seq for seq in self._finished_outside_step
                                       if seq.request_id != request_id]
        self._forget_finished_flight()

    def _forget_finished_flight(self) -> None:
        """Drop the step in flight once none of its sequences runs (aborted): nothing of it is
        left to commit, and the engine then holds nothing."""
        if self._in_flight is not None and all(s.is_finished for s in self._in_flight.sequences):
            self._in_flight = None

    def has_work(self) -> bool:
        """True while a step can still run something or report something."""
        return self.scheduler.has_unfinished or bool(self._finished_outside_step)

    def _release(self, seq: Sequence, controller: bool = True) -> None:
        """Take a sequence out of the queues, the KV cache, the proposer and (unless it leaves
        in a step, whose outcome releases it) the controller."""
        self.scheduler.finish(seq)
        if controller:
            self.controller.release(seq)
        if seq.slot is not None:
            self.runner.free_slot(seq.slot, self._leaving(seq))
            self.slot_adjustments.release(seq.slot)
            seq.slot = None
        if self.proposer is not None:
            self.proposer.remove(seq.seq_id)

    def _prefix_hit(self, seq: Sequence) -> tuple[int, int]:
        """The scheduler's prefix-cache lookup for a newcomer (:mod:`engine.prefix_caching`)."""
        return prefix_hit(self.runner, seq) if self.prefix_caching else (0, 0)

    def _leaving(self, seq: Sequence) -> list[int] | None:
        """The committed tokens a sequence leaving its slot leaves in the prefix cache."""
        return leaving_tokens(seq) if self.prefix_caching else None

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Run one engine step; return the sequences that got tokens or finished."""
        start = time.perf_counter()
        updated, self._finished_outside_step = self._finished_outside_step, []
        try:
            return updated + self._run_step(start)
        except BaseException:
            # (a step that raised must not lose what finished outside it: the next reports it,
            # nor leave a grammar walk running into the next)
            self.grammar_masks.cancel()
            self._finished_outside_step = updated + self._finished_outside_step
            raise

    def _run_step(self, start: float) -> list[Sequence]:
        """The stages of :meth:`step`, in order; returns the sequences they updated. A step
        that decodes plainly samples ahead and is committed after the next one is launched
        (:meth:`_overlapped`)."""
        if self._in_flight is not None:
            return self._overlapped(start)
        items, free_kv_tokens, plan_step = self._schedule()
        if not items:
            self._learn()
            return self._fail_unschedulable()
        forced = self._forced(items, free_kv_tokens)
        proposed = self._propose(items, free_kv_tokens, forced)
        prepend_forced(items, forced, self.vocab_size, self.device, self.max_grammar_drafts,
                       self.max_model_len)
        forwarded = self._forward(items, proposed)
        self._learn()  # (the last step's outcome, in the forward's shadow on a GPU)
        if self._overlaps(forwarded, proposed):
            self._in_flight = self._sample_ahead(
                forwarded, plan_step, self._flight_sampling([i.seq for i in forwarded.items]))
            return self._overlapped(start)
        if self._overlaps_hosted(forwarded, proposed):  # (a grammar's mask, penalties: the
            # host processes the logits, the device samples; the next step is sampled after
            # this one commits)
            self._in_flight = self._sample_hosted(Pending(forwarded, plan_step), ahead=False)
            return self._overlapped(start)
        if self._overlaps_drafting(forwarded, proposed):
            seqs = [item.seq for item in forwarded.items]
            base = [seq.num_tokens - 1 for seq in seqs]  # (each fed token's position)
            # (one copy: the positions, then the drafts [batch, k])
            values = self.runner.to_device(base + [t for i in forwarded.items for t in i.drafts])
            self._in_flight = self._verify_ahead(
                forwarded, plan_step, values[:len(seqs)], base,
                values[len(seqs):].view(len(seqs), -1), self._chain_sampling(seqs))
            return self._overlapped(start)
        verified = self._verify(forwarded)
        updated = self._commit(forwarded, verified)
        self._record(forwarded, proposed, verified, updated, start, plan_step)
        return updated

    # ------------------------------------------------------------------ the stages
    def _schedule(self) -> tuple[list[SeqStep], int | None, int]:
        """1. This step's sequences and the drafts each may ask for (none: nothing runs), the
        KV cache's free rows before the step, and the controller's step number."""
        plan, self._planned = self._planned, None
        if plan is None or self.scheduler.waiting:  # (with requests waiting: planned again)
            plan = self.controller.plan(self.scheduler.running, bool(self.scheduler.waiting))
        else:  # (made while the last step was in flight: its tokens cut caps and fronts)
            self.controller.refresh(plan, self.scheduler.running)
        free_kv_tokens = self.runner.num_free_tokens
        out = self.scheduler.schedule(plan.drafts_for, free_kv_tokens,
                                      self._prefix_hit if self.prefix_caching else None)
        for seq in out.admitted:
            seq.slot = self.runner.allocate_slot()
        if self.prefix_caching:
            attach_hits(self.runner, out.scheduled, out.admitted, self.metrics)
        return [SeqStep(s.seq, s.num_context_tokens, s.samples, s.num_spec_tokens)
                for s in out.scheduled], free_kv_tokens, plan.step

    def _fail_unschedulable(self) -> list[Sequence]:
        """Nothing runs and the next waiting sequence does not fit the KV cache: fail it."""
        if not self.scheduler.waiting:
            return []
        seq = self.scheduler.waiting.popleft()
        seq.finish("error", error=f"the KV cache cannot hold this request's {seq.num_tokens} "
                                  "tokens; raise kv_cache_tokens")
        return [seq]

    def _forced(self, items: list[SeqStep], free_kv_tokens: int | None) -> dict[int, list[int]]:
        """2a. The tokens the grammars of decoding samples force (index -> tokens), within the
        KV cache's spare rows and the step's token budget (:mod:`engine.grammar_steps`)."""
        if not any(item.seq.grammar is not None for item in items):
            return {}
        used = sum(item.num_context_tokens + item.num_spec_tokens for item in items)
        spare = self.config.max_num_batched_tokens - used
        if free_kv_tokens is not None:
            spare = min(spare, free_kv_tokens - used)
        limit = min(self.config.structured_forced_tokens, self.max_grammar_drafts)
        forced = forced_drafts(items, limit, self.max_model_len, max(0, spare))
        # (a step the plan gives no drafts could overlap: it does unless every sample gains
        # forced tokens, OverlappedSteps._forces_tokens says why; a step with a proposer's
        # drafts is synchronous anyway)
        plain = not any(item.num_spec_tokens > 0 for item in items)
        if self.overlap and plain and forced and not all(
                len(forced.get(i, ())) >= 2 for i, item in enumerate(items) if item.samples):
            return {}
        return forced

    def _propose(self, items: list[SeqStep], free_kv_tokens: int | None,
                 forced: dict[int, list[int]]) -> Proposed:
        """2b. The drafts of the items given drafts (their records are filled in), kept within
        the controller's trim, the KV cache's spare rows and, for trees, the step's budget. A
        proposer whose drafts are free continues after a sample's ``forced`` tokens; another
        is not asked for that sample this step."""
        free = self.proposer is not None and self.proposer.drafts_are_free
        wanted = [i for i, item in enumerate(items) if item.num_spec_tokens > 0
                  and (free or i not in forced)]
        if not wanted or self.proposer is None:
            return Proposed()
        new = any(items[i].seq.num_output_tokens <= 1 for i in wanted)
        first = not self._proposed_last_step or new
        start = time.perf_counter()
        # trees only in steps this small, and where they measured faster than chains
        spec = self.config.speculative_config
        tree = [len(items) <= TREE_MAX_SEQS and items[i].seq.grammar is None
                and tree_ok(items[i].seq, spec) for i in wanted]
        if any(tree) and not self.controller.allows_tree(len(items)):
            tree = [False] * len(wanted)
        # (the step may verify ahead: flight_steps.OverlappedSteps._overlaps_drafting)
        uniform = (self.overlap and self.proposer.drafts_on_device and not forced
                   and not any(tree) and len(wanted) == len(items)
                   and all(item.num_context_tokens == 1 and self._drafts_ahead(item.seq)
                           for item in items))
        proposal = self.proposer.propose([
            ProposeRequest(seq.seq_id, seq.all_token_ids + forced[i] if i in forced
                           else seq.all_token_ids, items[i].num_spec_tokens, seq.params,
                           seq.adjuster.adjust_prefix if seq.adjuster.active else None,
                           tree=t, seed=seq.seed,
                           position=seq.num_output_tokens + len(forced.get(i, ())),
                           uniform=uniform)
            for i, t in zip(wanted, tree, strict=True) for seq in [items[i].seq]])
        parents = proposal.parents or [None] * len(wanted)
        # (a tree counts as its levels: the controller chooses how deep it goes)
        depths = [len(d) if t is None else tree_depth(t)
                  for d, t in zip(proposal.draft_token_ids, parents, strict=True)]
        backed = proposal.num_backed
        if backed is not None:
            backed = [b if t is None else d for b, t, d in zip(backed, parents, depths,
                                                               strict=True)]
        # (the step's other sequences, which asked for no drafts, lay out the step with these)
        asked = set(wanted)
        rest = [item.num_context_tokens for i, item in enumerate(items) if i not in asked]
        keep = self.controller.trim([items[i] for i in wanted], depths, backed,
                                    (len(rest), max(rest, default=0), sum(rest)))
        spare = (None if free_kv_tokens is None
                 else free_kv_tokens - sum(item.num_context_tokens for item in items)
                 - sum(map(len, forced.values())))
        chains = iter(within_spare([k for k, t in zip(keep, parents, strict=True) if t is None],
                                   spare))
        trees, offset = {}, 0
        for j, (i, drafts, k) in enumerate(zip(wanted, proposal.draft_token_ids, keep,
                                               strict=True)):
            item = items[i]
            if parents[j] is not None:
                trees[i] = (drafts, parents[j], k)
            else:
                k = next(chains)
                item.drafts, item.depth = list(drafts)[:k], k
                if backed is not None:
                    item.backed = min(backed[j], k)
                if proposal.draft_probs is not None:
                    item.draft_probs = proposal.draft_probs[offset:offset + k]
            offset += len(drafts)
        if trees:
            keep_trees(items, trees, free_kv_tokens, self.config.max_num_batched_tokens,
                       self.max_model_len)
        return Proposed(True, time.perf_counter() - start,
                        not first and self.proposer.last_proposal_steady,
                        not self._proposed_last_step and not new, max(depths))

    def _forward(self, items: list[SeqStep], proposed: Proposed) -> Forwarded | None:
        """3. One target forward over the step; on ``KVCacheFull`` preempt and retry. None when
        preemption emptied the step. Prefill chunks are cached either way; on a GPU a proposer
        that keeps state of the text sees the contexts while the forward runs."""
        started = time.perf_counter()
        while items:
            self.grammar_masks.start(items)  # (a GPU: walks while the forward is launched, runs)
            slots, tokens, logits_indices, num_kept, trees, prompt_rows = forward_inputs(items)
            try:
                out = self.runner.forward(slots, tokens, logits_indices, trees=trees,
                                          keep_hidden=self.keep_hidden)
            except KVCacheFull:
                self.grammar_masks.cancel()
                items = self._preempt_one(items)
                continue
            except BaseException:
                self.grammar_masks.cancel()
                raise
            self._observe(items, proposed)
            for item in items:
                if not item.samples:
                    item.seq.num_computed_tokens += item.num_context_tokens
            row = num_kept
            for i, count in prompt_rows:  # (raw values, as vLLM's prompt logprobs)
                items[i].seq.add_prompt_logprobs(to_values(out.logits[row:row + count],
                                                           "raw_logprobs"))
                row += count
            sampling = any(item.samples for item in items)
            return Forwarded(items, out, out.logits[:num_kept] if sampling else None, started)
        return None

    def _observe(self, items: list[SeqStep], proposed: Proposed) -> None:
        """While a GPU runs the forward: a proposer that keeps state of the text (n-gram's
        index, the draft head's pending pairs) and was not asked for drafts sees the sampling
        sequences' contexts (``Proposer.observe``) at every ``observe_every``-th such step,
        so that a later proposal does not catch up on every token since the last one
        (docs/design.md, "Measured reasons behind the runner's choices")."""
        self._proposed_last_step = proposed.asked
        if proposed.asked:
            self._unobserved = 0
            return
        if self.proposer is None or not self.proposer.observes or not self.forward_is_async:
            return
        self._unobserved += 1
        if self._unobserved < self.proposer.observe_every:
            return
        self._unobserved = 0
        requests = [ProposeRequest(seq.seq_id, seq.all_token_ids, 0, seq.params)
                    for item in items if item.samples for seq in [item.seq]
                    if seq.speculation.limit]  # (a request that never drafts: never indexed)
        if requests:
            self.proposer.observe(requests)
            self._proposed_last_step = True

    def _preempt_one(self, items: list[SeqStep]) -> list[SeqStep]:
        """Preempt the most recently admitted sequence (recomputed later); a sequence that does
        not fit even alone fails with an error. Returns the step's items without it."""
        victim = self.scheduler.running[-1]
        if len(self.scheduler.running) == 1:
            self._release(victim)
            victim.finish("error", error="the KV cache cannot hold this request alone; raise "
                                         "kv_cache_tokens or lower max_model_len")
            self._finished_outside_step.append(victim)
        else:
            if self.proposer is not None:
                self.proposer.remove(victim.seq_id)
            self.runner.free_slot(victim.slot, self._leaving(victim))
            self.scheduler.preempt()
            self.metrics.num_preemptions += 1
        return [item for item in items if item.seq is not victim]

    def _verify(self, forwarded: Forwarded | None) -> list[Verified]:
        """4. Adjust each kept row with the history its position has (rows that are not usable
        fail their sequence alone), then verify every sampling sequence's drafts at once."""
        if forwarded is None or forwarded.logits is None:
            return []
        logits = forwarded.logits  # [num_rows, vocab_size]
        items = [item for item in forwarded.items if item.samples]
        seqs = [item.seq for item in items]
        mode = self.config.logprobs_mode
        wants_logprobs = any(s.params.logprobs is not None for s in seqs)
        raw = logits.clone() if wants_logprobs and mode.startswith("raw") else None
        row = 0
        for item in items:
            if item.seq.adjuster.active:
                item.seq.adjuster.apply(logits[row:row + len(item.drafts) + 1],
                                        item.seq.output_token_ids, item.drafts)
            row += len(item.drafts) + 1
        self.grammar_masks.apply(logits)  # (before temperature, top-k/p and verification)
        failed = non_finite_rows(logits, [item.drafts for item in items])
        processed = logits.clone() if wants_logprobs and mode.startswith("processed") else None
        sampling = self._sampling_tensors(seqs)
        paths: list[list[int] | None] = [None] * len(items)
        if any(item.parents is not None for item in items):
            tokens, paths = verify_trees(
                logits, items, lambda js, rows: self._verify_chains([items[j] for j in js], rows),
                lambda trees: SamplingTensors.from_params([t.seq.params for t in trees], None,
                                                          self.device, self.generator),
                self.generator)
        else:
            tokens = self._verify_chains(items, logits, sampling)
        values = raw if raw is not None else processed
        if processed is not None:
            values = process_logits(processed, sampling, [len(i.drafts) + 1 for i in items])
        values = None if values is None else to_values(values, mode)
        verified, row = [], 0
        for j, (item, out) in enumerate(zip(items, tokens, strict=True)):
            new = [t for t in out if t != PLACEHOLDER_TOKEN_ID]
            bad = j in failed or (bool(out) and out[0] == INVALID_TOKEN_ID)
            result = Verified(item, new, len(new) - 1, item.seq.num_tokens, row, bad, paths[j])
            if values is not None and item.seq.logprobs is not None and not bad:
                result.logprob_rows = values[row:row + len(item.drafts) + 1]
            verified.append(result)
            row += len(item.drafts) + 1
        return verified

    def _verify_chains(self, items: list[SeqStep], logits: torch.Tensor,
                       sampling: SamplingTensors | None = None,
                       sync: bool = True) -> list[list[int]] | torch.Tensor:
        """The sampler over chains' rows ``[num_tokens + len(items), vocab_size]``; each
        item's tokens ``[max_spec_len + 1]`` with placeholders (``sync=False``: as the tensor
        ``[len(items), max_spec_len + 1]`` on the device)."""
        if sampling is None:
            sampling = self._sampling_tensors([item.seq for item in items])
        probs = [item.draft_probs for item in items if item.drafts]
        draft_probs = None
        if any(p is not None for p in probs):  # (drafts without probabilities: one-hot rows)
            draft_probs = torch.cat([
                one_hot(item.drafts, self.vocab_size, self.device)
                if item.draft_probs is None else item.draft_probs
                for item in items if item.drafts])
        metadata = SpecDecodeMetadata.from_lists([item.drafts for item in items], self.device)
        sampler = (self.greedy_sampler if self.greedy_sampler is not None and sampling.all_greedy
                   else self.sampler)  # (the argmax match, without the probability work)
        tokens = sampler.verify(logits, metadata, sampling, draft_probs)
        return tokens.tolist() if sync else tokens

    def _sampling_tensors(self, seqs: list[Sequence], ahead: int = 0) -> SamplingTensors:
        """The sampling parameters of ``seqs``, each seeded one keyed by its seed and the output
        position of its first row this step (``ahead``: its tokens in flight, not yet
        appended)."""
        return SamplingTensors.from_params([s.params for s in seqs], None, self.device,
                                           self.generator, [s.seed for s in seqs],
                                           [s.num_output_tokens + ahead for s in seqs])

    def _commit(self, forwarded: Forwarded | None, verified: list[Verified],
                ahead: dict[int, int] | None = None,
                written: Collection[int] | None = ()) -> list[Sequence]:
        """5. Append each verified sequence's tokens with stop checks, cut every running
        sequence's cache back to its kept context (the newest token stays uncached: it is fed
        next step, or, for the sequences ``ahead`` (id -> the flight's width), it is being fed
        by the step in flight, whose rows are kept), tell the proposer what was kept and hand a
        draft head its features but those of the sequences ``written`` (ids; None: all of
        them) on the device; finished sequences leave (the controller releases them once it
        has learnt the step)."""
        updated = []
        now = time.perf_counter()  # (the step's tokens arrived together)
        for result in verified:
            seq = result.item.seq
            if result.failed:
                seq.finish("error", error=FAILED_ROW)
            else:
                result.kept = append_until_stop(seq, result.tokens, self.eos_token_ids,
                                                self.max_model_len)
                if seq.grammar is not None:
                    self._advance_grammar(seq, result.tokens[:result.kept])
                if result.logprob_rows is not None:
                    seq.add_logprobs(result.logprob_rows[:result.kept],
                                     result.tokens[:result.kept])
                self._account(seq, result, now)
            updated.append(seq)
        if forwarded is not None:
            self._rollback(forwarded, verified, ahead or {})
            if written is not None:
                self._hand_features(forwarded, verified, written)
        for seq in updated:
            if seq.is_finished:
                self._release(seq, controller=False)
        return updated

    def _advance_grammar(self, seq: Sequence, tokens: list[int]) -> None:
        """The sample's matcher accepts the tokens it kept; a grammar that has ended (its stop
        token accepted, e.g. with ``ignore_eos``) ends the sample, so that a terminated matcher
        is never asked for another mask."""
        if not seq.grammar.advance(tokens):
            seq.finish("error", error="the grammar refused a verified token (a masking bug)")
        elif seq.grammar.terminated and not seq.is_finished:
            seq.finish("stop")

    def _rollback(self, forwarded: Forwarded, verified: list[Verified],
                  ahead: dict[int, int]) -> None:
        paths = [(r.item.seq.slot, r.num_tokens_before, r.path) for r in verified
                 if r.path is not None and not r.item.seq.is_finished]
        if paths:  # (each tree's accepted branch, next to the context)
            self.runner.keep_paths(paths)
        for result in verified:
            seq = result.item.seq
            if seq.is_finished:  # (its rows: the context verified on and a chain's kept drafts)
                seq.num_computed_tokens = result.num_tokens_before + (
                    min(result.num_accepted, result.kept) if result.item.parents is None else 0)
                continue
            if id(seq) in ahead:  # (its newest token's rows are being written, and those
                # the flight reserved past them go back; it counts as uncached, as after a
                # synchronous step, until that step commits)
                seq.num_computed_tokens = seq.num_tokens - 1
                if ahead[id(seq)]:  # (a flight fed from chains reserved rows past its own)
                    self.runner.truncate(seq.slot, seq.num_tokens - 1 + ahead[id(seq)])
                continue
            seq.num_computed_tokens = seq.num_tokens - 1
            self.runner.truncate(seq.slot, seq.num_computed_tokens)
            if result.item.drafts and self.proposer is not None:
                self.proposer.on_accepted(
                    seq.seq_id, result.num_tokens_before + min(result.num_accepted, result.kept))

    def _hand_features(self, forwarded: Forwarded, verified: list[Verified],
                       written: Collection[int] = ()) -> None:
        """A proposer that drafts from the target's features (a draft head) gets each running
        sequence's final hidden states (or its ``feature_layers``' inputs) at the positions
        this forward verified, but those of the sequences ``written`` (ids: it has them)."""
        if not self.keep_hidden or len(written) == len(forwarded.items):
            return
        out = forwarded.output
        # [total_new_tokens, hidden_size] (with feature layers: [.., layers * hidden_size]) or None
        hidden = out.aux_hidden if self.proposer.feature_layers else out.hidden
        if hidden is not None:
            updates, hidden = feature_updates(forwarded.items, verified, hidden, written)
            if updates:
                self.proposer.on_features(updates, hidden)

    def _account(self, seq: Sequence, result: Verified, now: float) -> None:
        # (a tree: its levels, the most it can accept; forced drafts count as drafts)
        drafted = result.item.depth + result.item.forced
        account(seq, drafted, result.num_accepted, result.kept, now)
        self.metrics.record_request_step(drafted, result.num_accepted, result.kept)

    def _record(self, forwarded: Forwarded | None, proposed: Proposed,
                verified: list[Verified], updated: list[Sequence], start: float,
                plan_step: int, cost_s: float | None = None) -> None:
        """6. The step's time for the metrics, and its outcome for the controller: learnt now
        on CPU (or with nothing left to run), else during the next step's forward. ``cost_s``:
        the step's cost for the controller when not its call's duration (an overlapped
        step's device time)."""
        end = time.perf_counter()
        self.metrics.record_step(end - start, proposed.seconds,
                                 end - (forwarded.started if forwarded else end),
                                 proposed.draft_steps if proposed.typical else 0)
        self._outcome = step_outcome(forwarded, proposed, verified, updated,
                                     end - start if cost_s is None else cost_s, plan_step)
        if not self.forward_is_async or not self.scheduler.has_unfinished:
            self._learn()

    def _learn(self, defer: bool = False) -> None:
        """The controller learns the outcome it has not seen yet (see :meth:`_run_step`);
        ``defer``: steps overlap, and it may learn it with the next few."""
        if self._outcome is not None:
            outcome, self._outcome = self._outcome, None
            self.controller.learn(outcome, defer)

