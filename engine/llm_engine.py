"""The step loop: schedule -> propose -> forward -> adjust -> verify -> append + stop -> rollback.

One :meth:`LLMEngine.step`:

1. **schedule**: the scheduler picks the running sequences (decodes, prefill chunks) and admits
   newcomers; the speculation policy (:mod:`scheduler.spec_policy`) says how many drafts each
   sequence that samples this step may verify.
2. **propose**: every sequence that samples gets its seeded stream reset to ``step_seed`` and
   asks the proposer for its drafts.
3. **forward**: ONE target forward scores everything: prefill chunks, and for each sampling
   sequence its uncached tokens followed by its drafts; the logits of the last
   ``len(drafts) + 1`` positions of each sampling sequence are kept. ``KVCacheFull`` preempts
   the most recently admitted sequence and retries (:mod:`scheduler.scheduler`).
4. **adjust**: penalties, bias, allowed ids, bad words and min-tokens masking are applied to each
   kept row with the history that position has (:mod:`samplers.logits_adjust`).
5. **verify**: the sampler verifies all drafts at once.
6. **append + stop**: accepted tokens and the recovered or bonus token are appended one by one
   with stop checks (:func:`engine.stop_checker.append_until_stop`); finished sequences leave.
7. **rollback**: the target cache is cut back to the kept context (the newest token stays
   uncached) and the proposer learns the kept length.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.builder import EngineComponents, build_components
from engine.config import EngineConfig
from engine.logprobs import to_values
from engine.metrics import MetricsCollector
from engine.runner.cuda_graphs import batch_bucket
from engine.runner.kv_cache import KVCacheFull
from engine.sequence import Sequence
from engine.stop_checker import append_until_stop
from proposers import FeatureUpdate, ProposeRequest
from samplers import (
    INVALID_TOKEN_ID,
    PLACEHOLDER_TOKEN_ID,
    SamplingParams,
    SamplingTensors,
    tree_verify,
)
from samplers.logits_adjust import tokenize_bad_words
from samplers.logits_processing import logits_to_probs, process_logits
from samplers.metadata import SpecDecodeMetadata
from scheduler import ScheduledSequence, Scheduler, SpeculationPolicy


@dataclass
class _Verified:
    """One sampling sequence's result, from verification to rollback."""

    num_drafted: int  # drafts verified (a tree's nodes): its rows are num_drafted + 1
    num_accepted: int  # drafts the sampler accepted (before stop checks)
    num_tokens_before: int  # the sequence's tokens before this step's append
    first_row: int  # its first row among the step's kept logits rows
    kept: int = 0  # tokens appended (the stop checks may cut the accepted run)
    depth: int = 0  # drafts as the controller and the metrics count them (a tree's levels)
    path: list[int] | None = None  # a tree's accepted nodes, root's child first


@dataclass
class _StepBatch:
    """The sequences of one forward, their drafts, and what the step learnt about them."""

    items: list[ScheduledSequence]
    drafts: list[list[int]] = field(default_factory=list)  # [batch_size] draft ids per item
    # [batch_size] per item: [len(drafts[i]), vocab_size] draft probabilities, or None (one-hot)
    probs: list[torch.Tensor | None] = field(default_factory=list)
    # [batch_size] per item: how many of its drafts the proposer's evidence backs (None: all)
    backed: list[int | None] = field(default_factory=list)
    # [batch_size] per item: its drafts' tree parents (``Proposal.parents``), None: a chain
    trees: list[list[int] | None] = field(default_factory=list)
    free_kv_tokens: int | None = None  # the KV cache's free rows before this step
    failed: set[int] = field(default_factory=set)  # sampling indices whose logits are unusable
    verified: list[_Verified] = field(default_factory=list)  # [num sampling items]
    # [num_rows, vocab_size] the logits logprobs are taken from (raw or adjusted), when asked
    logprob_logits: torch.Tensor | None = None
    # (item index, rows) of the prompt-logprob rows planned after the kept ones
    prompt_rows: list[tuple[int, int]] = field(default_factory=list)
    propose_s: float = 0.0
    first_proposal: bool = False  # a sequence's first, or the first after steps without one
    # (the proposer reads what it missed: slow)
    proposed: bool = False  # the proposer was asked for drafts
    observed: bool = False  # or shown the contexts instead (``Proposer.observe``)
    # timed like the proposals after it (not a first look at a prompt, a graph capture ...)
    typical_proposal: bool = False
    after_idle: bool = False  # the first proposal after steps without one (a probe's), no
    # sequence new to the proposer: its time is what such a proposal costs (catch-up included)
    num_draft_steps: int = 0
    target_start: float = 0.0  # perf_counter() when the target forward began
    verified_at: float = 0.0  # perf_counter() when verification returned (0: no verification)
    runner_trees: list | None = None  # the forward's trees (ModelRunner.forward), or None
    tree_paths: dict[int, list[int]] = field(default_factory=dict)  # item -> accepted nodes

    @property
    def sampling(self) -> list[int]:
        """Indices of the items that sample this step (their chunk reaches the context's end)."""
        return [i for i, item in enumerate(self.items) if item.samples]

    def drop(self, seq: Sequence) -> None:
        """Take a preempted sequence out of the step."""
        keep = [i for i, item in enumerate(self.items) if item.seq is not seq]
        self.items = [self.items[i] for i in keep]
        self.drafts = [self.drafts[i] for i in keep]
        self.probs = [self.probs[i] for i in keep]
        self.backed = [self.backed[i] for i in keep]
        self.trees = [self.trees[i] for i in keep]

    def draft_probs(self, items: list[int]) -> torch.Tensor | None:
        """``[num_tokens, vocab_size]``: the draft probabilities of ``items``' drafts, in order
        (None: one-hot drafts)."""
        probs = [self.probs[i] for i in items if self.drafts[i]]
        return torch.cat(probs) if any(p is not None for p in probs) else None

    def levels(self) -> list[list[int]]:
        """Each item's drafts, a tree's as one per level (how the controller counts them: it
        chooses a tree's depth, and a tree step's time is that depth's)."""
        if not any(self.trees):
            return self.drafts
        return [d if t is None else [0] * tree_depth(t) for d, t in zip(self.drafts, self.trees,
                                                                       strict=True)]

    def depth(self, i: int) -> int:
        """Item ``i``'s drafts as the controller counts them: a tree's levels."""
        tree = self.trees[i]
        return len(self.drafts[i]) if tree is None else tree_depth(tree)


# A step verifies draft trees only when it runs at most this many sequences (a larger batch
# drafts chains). Measured on the H100 with the
# default model and its head (draft_tree [3, 2], k = 4, the controller on, open prompts, over
# the engine without speculation; docs/performance.md, "Draft trees"): trees won at batch 1
# (1.22-1.31x against 1.14-1.21x for chains, four runs) and 2 (1.42x against 1.10x), and lost at
# batch 4 (eagle 1.11x against 1.08x, but ngram_eagle 0.81x against 0.98x; 0.87x against 1.22x
# the run before) and 8 (0.88-0.97x against 1.05-1.07x): each tree node is a token of the
# target's forward and a query of the head, and a tree step's host work grows with the batch.
TREE_MAX_SEQS = 2


def tree_depth(parents: list[int]) -> int:
    """Levels of a tree given by its nodes' parents (a parent before its children)."""
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return max(depths, default=0)


def pruned_tree(drafts: list[int], parents: list[int], depth: int,
                max_nodes: int) -> tuple[list[int], list[int]]:
    """The best ``max_nodes`` nodes of a draft tree within ``depth`` levels, renumbered (a
    parent still before its children). Siblings come likeliest first (``Proposal.parents``),
    so a node's *rank* is the sum of its own and its ancestors' places among their siblings:
    the likeliest chain ranks 0 and is kept first, then the branches one step off it, and so
    on (ties: the shallower first). A node never ranks below its parent: what is kept is a
    tree."""
    depths: list[int] = []
    ranks: list[int] = []
    seen: dict[int, int] = {}  # parent -> children so far
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
        place = seen.get(p, 0)
        seen[p] = place + 1
        ranks.append(place + (ranks[p] if p >= 0 else 0))
    order = sorted((j for j in range(len(parents)) if depths[j] <= depth),
                   key=lambda j: (ranks[j], depths[j], j))
    chosen = sorted(order[:max(max_nodes, 0)])
    index = {j: n for n, j in enumerate(chosen)}
    return ([drafts[j] for j in chosen],
            [-1 if parents[j] < 0 else index[parents[j]] for j in chosen])


def check_sampling_params(params: SamplingParams, vocab_size: int, tokenizer: Any) -> None:
    """Raise ``ValueError`` when ``params`` names token ids outside the vocabulary, or a bad
    word that the tokenizer turns into no tokens (it could never be banned)."""
    params.verify_vocab(vocab_size)
    for word in params.bad_words or []:
        if not tokenize_bad_words(tokenizer, [word]):
            raise ValueError(f"SamplingParams.bad_words entry {word!r} tokenizes to no "
                             "tokens: it cannot ban anything")


class LLMEngine:
    """Continuous-batching speculative decoding over one target model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        parts: EngineComponents = build_components(config)
        self.model, self.tokenizer = parts.model, parts.tokenizer
        self.runner, self.proposer, self.sampler = parts.runner, parts.proposer, parts.sampler
        self.greedy_sampler = parts.greedy_sampler
        if self.proposer is not None and self.proposer.needs_features:
            self.runner.keep_features(True)
        self.device = parts.device
        # the host waits for the device at verification, so work put between a forward's launch
        # and that wait is free (a GPU; on CPU the forward runs in the call)
        self.forward_is_async = self.device.type == "cuda"
        self.vocab_size = parts.vocab_size
        self.max_model_len = parts.max_model_len
        self.eos_token_ids = parts.eos_token_ids
        self.generator = parts.generator
        self.max_model_len_source = parts.max_model_len_source
        spec = config.speculative_config
        max_k = spec.num_speculative_tokens if spec is not None and self.proposer else 0
        graphs = getattr(self.runner, "graphs", None)
        if graphs is not None and spec is not None and spec.draft_tree is not None:
            # (trees only in small batches: a larger one's widest step is a chain's)
            graphs.twin_width = lambda batch_size, widest=graphs.max_num_new: (
                widest if batch_size <= TREE_MAX_SEQS else max_k + 1)
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens)
        self.metrics = MetricsCollector(max_k)
        self.spec_policy = SpeculationPolicy(
            spec, max_k, self.max_model_len,
            drafts_are_free=bool(self.proposer and self.proposer.drafts_are_free),
            measured_draft_cost=lambda: self.metrics.draft_cost_ratio,
            batch_bucket=batch_bucket,  # (steps of one graph bucket cost the same)
            packed_rows=self.runner.packed_rows)
        # (on a GPU the controller learns each step's acceptance during the next forward)
        self.spec_policy.defer_updates = self.forward_is_async
        self.requests: dict[str, list[Sequence]] = {}
        self._finished_outside_step: list[Sequence] = []
        self._proposed_last_step = False  # (a proposal after a gap catches up: not timed)
        self._unobserved = 0  # steps since the proposer last saw the contexts (_observe)

    # ------------------------------------------------------------------ requests
    def check_params(self, params: SamplingParams) -> None:
        """:func:`check_sampling_params` against this engine's vocabulary and tokenizer."""
        check_sampling_params(params, self.vocab_size, self.tokenizer)

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
            seq.speculation = self.spec_policy.new_tracker(seq, together)
        self.requests[request_id] = seqs
        self.metrics.num_requests += 1
        error = self._request_error(prompt_token_ids, params)
        if error is None:
            error = seqs[0].adjuster.check_sampleable(self.vocab_size)
        for seq in seqs:
            if error is not None:
                self.spec_policy.release(seq)
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
            return (f"the prompt has {len(prompt_token_ids)} tokens; this engine holds at most "
                    f"{self.max_model_len} tokens per sequence (set by "
                    f"{self.max_model_len_source}), which leaves no room for output")
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

    def has_work(self) -> bool:
        """True while a step can still run something or report something."""
        return self.scheduler.has_unfinished or bool(self._finished_outside_step)

    def _release(self, seq: Sequence) -> None:
        """Take a sequence out of the queues, the KV cache and the proposer."""
        self.scheduler.finish(seq)
        self.spec_policy.release(seq)
        if seq.slot is not None:
            self.runner.free_slot(seq.slot)
            seq.slot = None
        if self.proposer is not None:
            self.proposer.remove(seq.seq_id)

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Run one engine step; return the sequences that got tokens or finished."""
        start = time.perf_counter()
        updated, self._finished_outside_step = self._finished_outside_step, []
        try:
            return updated + self._run_step(start)
        except BaseException:
            # (a step that raised must not lose what finished outside it: the next reports it)
            self._finished_outside_step = updated + self._finished_outside_step
            raise

    def _run_step(self, start: float) -> list[Sequence]:
        """The stages of :meth:`step`, in order; returns the sequences they updated."""
        updated: list[Sequence] = []
        batch = self._schedule()
        if batch is None:
            return updated + self._fail_unschedulable()
        self._propose(batch)
        logits = self._forward(batch)
        self.spec_policy.flush()  # (the last step's acceptance, while the forward runs)
        if logits is not None:
            self._observe(batch)
            self._adjust(batch, logits)
            tokens, logprob_rows = self._verify(batch, logits)
            updated += self._append_and_stop(batch, tokens, logprob_rows)
            self._rollback(batch)
        self._hand_features(batch)
        self._record(batch, start)
        return updated

    def _schedule(self) -> _StepBatch | None:
        """1. Pick this step's sequences and their number of drafts; None when nothing runs."""
        self.spec_policy.begin_step(self.scheduler.running, bool(self.scheduler.waiting))
        free_kv_tokens = self.runner.num_free_tokens
        plan = self.scheduler.schedule(self.spec_policy.num_spec_tokens, free_kv_tokens)
        for seq in plan.admitted:
            seq.slot = self.runner.allocate_slot()
        if not plan.scheduled:
            return None
        return _StepBatch(plan.scheduled, free_kv_tokens=free_kv_tokens)

    def _fail_unschedulable(self) -> list[Sequence]:
        """Nothing runs and the next waiting sequence does not fit the KV cache: fail it."""
        if not self.scheduler.waiting:
            return []
        seq = self.scheduler.waiting.popleft()
        seq.finish("error", error=f"the KV cache cannot hold this request's {seq.num_tokens} "
                                  "tokens; raise kv_cache_tokens")
        return [seq]

    def _propose(self, batch: _StepBatch) -> None:
        """2. Reset the seeded streams of the sampling sequences and collect their drafts."""
        for item in batch.items:
            if item.samples and item.seq.generator is not None:
                item.seq.generator.manual_seed(item.seq.step_seed())
        batch.drafts = [[] for _ in batch.items]
        batch.probs = [None for _ in batch.items]
        batch.backed = [None for _ in batch.items]
        batch.trees = [None for _ in batch.items]
        wanted = [i for i, item in enumerate(batch.items) if item.num_spec_tokens > 0]
        if not wanted or self.proposer is None:
            return
        batch.proposed = True
        new = any(batch.items[i].seq.num_output_tokens <= 1 for i in wanted)
        batch.first_proposal = not self._proposed_last_step or new
        batch.after_idle = not self._proposed_last_step and not new
        start = time.perf_counter()
        # (trees only in a step of at most TREE_MAX_SEQS sequences: a decode graph's twin is
        # as wide as a tree step only there)
        small = len(batch.items) <= TREE_MAX_SEQS
        tree_ok = [small and self._tree_ok(batch.items[i].seq) for i in wanted]
        proposal = self.proposer.propose([
            ProposeRequest(seq.seq_id, seq.all_token_ids, batch.items[i].num_spec_tokens,
                           seq.params, seq.generator,
                           seq.adjuster.adjust_prefix if seq.adjuster.active else None,
                           tree=ok)
            for i, ok in zip(wanted, tree_ok, strict=True) for seq in [batch.items[i].seq]])
        trees = proposal.parents or [None] * len(wanted)
        # (a tree counts as its levels: the controller chooses how deep it goes)
        levels = [d if t is None else [0] * tree_depth(t)
                  for d, t in zip(proposal.draft_token_ids, trees, strict=True)]
        backed = proposal.num_backed
        if backed is not None and proposal.parents is not None:
            backed = [b if t is None else len(d) for b, t, d in zip(backed, trees, levels,
                                                                    strict=True)]
        # (the step's other sequences, which asked for no drafts: the controller prices the
        # step's layout with them)
        asked = set(wanted)
        rest = [item.num_context_tokens for i, item in enumerate(batch.items) if i not in asked]
        keep = self.spec_policy.kept_drafts([batch.items[i] for i in wanted], levels, backed,
                                            batch.free_kv_tokens,
                                            (len(rest), max(rest, default=0), sum(rest)))
        offset = 0
        for j, (i, proposed, k) in enumerate(zip(wanted, proposal.draft_token_ids, keep,
                                                 strict=True)):
            if trees[j] is not None:
                continue
            batch.drafts[i] = list(proposed)[:k]
            if backed is not None:
                batch.backed[i] = min(backed[j], k)
            if proposal.draft_probs is not None:
                batch.probs[i] = proposal.draft_probs[offset:offset + len(batch.drafts[i])]
            offset += len(proposed)
        self._keep_trees(batch, wanted, proposal.draft_token_ids, trees, keep)
        batch.propose_s = time.perf_counter() - start
        batch.typical_proposal = not batch.first_proposal and self.proposer.last_proposal_steady
        batch.num_draft_steps = max(map(len, levels))

    def _tree_ok(self, seq: Sequence) -> bool:
        """Whether ``seq`` may verify a draft tree: nothing that makes a position's logits depend
        on the drafts before it (penalties, bias, bad words, min tokens), no logprobs (their
        rows would be the tree's), and greedy, or (``draft_tree_sampling``) sampled without a
        seed under the lossless rejection sampler (a seeded sample keeps its chains: whether a
        step drafts a tree depends on the batch, and the same seed must give the same text)."""
        spec = self.config.speculative_config
        params = seq.params
        return (spec is not None and spec.draft_tree is not None and not seq.adjuster.active
                and params.logprobs is None
                and (params.greedy or (spec.draft_tree_sampling and params.seed is None
                                       and spec.acceptance_method == "rejection_sampler")))

    def _keep_trees(self, batch: _StepBatch, wanted: list[int], drafts: list[list[int]],
                    trees: list[list[int] | None], keep: list[int]) -> None:
        """The trees' best nodes (:func:`pruned_tree`) within the levels the controller kept,
        within the KV cache's spare rows and the step's token budget (``max_num_batched_tokens``)
        after every chain's drafts (as ``kept_drafts`` cuts chains), and within the sequence's
        columns (``max_model_len``: every node takes one until verification)."""
        if not any(trees):
            return
        step_tokens = sum(item.num_context_tokens + len(d)
                          for item, d in zip(batch.items, batch.drafts, strict=True))
        free = batch.free_kv_tokens if batch.free_kv_tokens is not None else 1 << 62
        # (the KV cache's spare rows, and the step's token budget: a tree's nodes count)
        spare = min(free, self.config.max_num_batched_tokens) - step_tokens
        for j, (i, tree) in enumerate(zip(wanted, trees, strict=True)):
            if tree is None:
                continue
            room = self.max_model_len - batch.items[i].seq.num_tokens
            nodes, parents = pruned_tree(drafts[j], tree, keep[j], min(spare, room))
            spare -= len(nodes)
            if nodes:
                batch.drafts[i], batch.trees[i] = nodes, parents

    def _observe(self, batch: _StepBatch) -> None:
        """On a GPU, while the forward runs: a proposer that keeps state of the text (n-gram's
        index, the draft head's pending pairs) and was not asked for drafts this step sees the
        sampling sequences' contexts (``Proposer.observe``), so that a later proposal does not
        catch up on every token since the last one. Measured on the H100 with the default
        model, open prompts: a probe's proposal after up to 16 steps without one (the catch-up,
        the drafts and the controller's choice; probes now come up to 32 steps apart) took
        0.5-1.6 ms at batch 8, where a step takes about 4 ms, and 0.8-4.3 ms at batch 32. At
        every ``Proposer.observe_every``-th such step (n-gram: 8; the draft head: each), since
        n-gram's observe of every step took 0.15-0.28 ms at batch 8 and 0.33-0.41 ms at batch
        32 on the H100 (a plain step 2.5 / 3.9 ms), not all of it in the forward's shadow."""
        if batch.proposed:
            self._unobserved = 0
            return
        if self.proposer is None or not self.proposer.observes or not self.forward_is_async:
            return
        self._unobserved += 1
        if self._unobserved < self.proposer.observe_every:
            return
        self._unobserved = 0
        requests = [ProposeRequest(seq.seq_id, seq.all_token_ids, 0, seq.params)
                    for item in batch.items if item.samples for seq in [item.seq]
                    if seq.speculation.limit]  # (a request that never drafts: never indexed)
        if requests:
            self.proposer.observe(requests)
            batch.observed = True

    def _forward(self, batch: _StepBatch) -> torch.Tensor | None:
        """3. One target forward over the batch; on ``KVCacheFull`` preempt and retry.
        Returns the kept rows ``[num_tokens + num_sampling, vocab_size]`` (each sampling
        sequence's drafts' positions and its bonus position), or None when nothing samples or
        preemption emptied the batch. Prefill chunks are cached either way."""
        batch.target_start = time.perf_counter()
        while batch.items:
            slots, tokens, logits_indices, num_kept = self._plan_forward(batch)
            try:
                logits = self.runner.forward(slots, tokens, logits_indices,
                                             trees=batch.runner_trees)
            except KVCacheFull:
                self._preempt_one(batch)
                continue
            for item in batch.items:
                if not item.samples:
                    item.seq.num_computed_tokens += item.num_context_tokens
            if batch.prompt_rows:
                self._record_prompt_logprobs(batch, logits[num_kept:])
            return logits[:num_kept] if batch.sampling else None
        return None

    def _plan_forward(self, batch: _StepBatch) -> tuple[list[int], list[list[int]], list[int],
                                                         int]:
        """Each sequence's slot and new tokens (uncached context, then drafts), the rows whose
        logits are kept (each sampling sequence's last context position and its drafts), and
        after them the rows of prompt positions whose logprobs were asked for; with the number
        of kept rows."""
        slots, tokens, kept, prompt, trees = [], [], [], [], []
        batch.prompt_rows = []
        offset = 0
        for i, (item, drafts) in enumerate(zip(batch.items, batch.drafts, strict=True)):
            seq = item.seq
            start = seq.num_computed_tokens
            new = seq.all_token_ids[start:start + item.num_context_tokens] + drafts
            slots.append(seq.slot)
            tokens.append(new)
            tree = batch.trees[i] if batch.trees else None
            trees.append(None if tree is None else (item.num_context_tokens, tree))
            if item.samples:
                kept.extend(range(offset + len(new) - len(drafts) - 1, offset + len(new)))
            first = seq.next_prompt_logprob_position  # (None: nothing asked, or all there)
            if first is not None and start <= first < start + item.num_context_tokens:
                last = min(start + item.num_context_tokens, seq.num_prompt_tokens - 1)
                prompt.extend(range(offset + first - start, offset + last - start))
                batch.prompt_rows.append((i, last - first))
            offset += len(new)
        batch.runner_trees = trees if any(trees) else None
        return slots, tokens, kept + prompt, len(kept)

    def _record_prompt_logprobs(self, batch: _StepBatch, logits: torch.Tensor) -> None:
        """``logits [rows, vocab_size]``: the prompt positions planned in :meth:`_plan_forward`
        (raw values, as vLLM's prompt logprobs)."""
        row = 0
        for i, count in batch.prompt_rows:
            batch.items[i].seq.add_prompt_logprobs(to_values(logits[row:row + count],
                                                             "raw_logprobs"))
            row += count

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
        batch.drop(victim)

    def _adjust(self, batch: _StepBatch, logits: torch.Tensor) -> None:
        """4. Per-position penalties, bias, allowed ids and bad words, in place; rows that are
        not usable (NaN, +inf, nothing finite) fail their sequence alone. Raw logprobs are taken
        from a copy made before."""
        if self.config.logprobs_mode.startswith("raw") and any(
                batch.items[i].seq.params.logprobs is not None for i in batch.sampling):
            batch.logprob_logits = logits.clone()  # [num_rows, vocab_size]
        row = 0
        for i in batch.sampling:
            seq, drafts = batch.items[i].seq, batch.drafts[i]
            if seq.adjuster.active:
                seq.adjuster.apply(logits[row:row + len(drafts) + 1], seq.output_token_ids,
                                   drafts)
            row += len(drafts) + 1
        batch.failed = self._non_finite_rows(logits, [batch.drafts[i] for i in batch.sampling])

    @staticmethod
    def _non_finite_rows(logits: torch.Tensor, drafts: list[list[int]]) -> set[int]:
        """Sequences (indices into ``drafts``) with a NaN, +inf or all -inf logits row, off CUDA.

        Their rows are zeroed so that the others verify. On CUDA the kernels mark such a
        sequence with ``INVALID_TOKEN_ID`` instead, without a sync.
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

    def _verify(self, batch: _StepBatch,
                logits: torch.Tensor) -> tuple[list[list[int]], torch.Tensor | None]:
        """5. Verify every sampling sequence's drafts at once. Returns each one's tokens
        (``[max_spec_len + 1]`` with placeholders) and, when a sequence asked for logprobs, the
        rows' values in ``EngineConfig.logprobs_mode`` ``[num_rows, vocab_size]``."""
        seqs = [batch.items[i].seq for i in batch.sampling]
        drafts = [batch.drafts[i] for i in batch.sampling]
        sampling = SamplingTensors.from_params([s.params for s in seqs],
                                               [s.generator for s in seqs], self.device,
                                               self.generator)
        draft_probs = batch.draft_probs(batch.sampling)  # [num_tokens, vocab_size] or None
        mode = self.config.logprobs_mode
        if mode.startswith("processed") and any(s.params.logprobs is not None for s in seqs):
            batch.logprob_logits = logits.clone()  # [num_rows, vocab_size], adjusted
        if batch.runner_trees is None:
            metadata = SpecDecodeMetadata.from_lists(drafts, self.device)
            tokens = self._sampler_for(sampling).verify(logits, metadata, sampling,
                                                        draft_probs).tolist()
        else:
            tokens = self._verify_trees(batch, logits, seqs, drafts)
        batch.verified_at = time.perf_counter()  # forward + verify done (synchronised)
        values = batch.logprob_logits
        if values is not None and mode.startswith("processed"):
            values = process_logits(values, sampling, [len(d) + 1 for d in drafts])
        return tokens, None if values is None else to_values(values, mode)

    def _sampler_for(self, sampling: SamplingTensors):
        if self.greedy_sampler is not None and sampling.all_greedy:
            return self.greedy_sampler  # the argmax match, without the probability work
        return self.sampler

    def _verify_trees(self, batch: _StepBatch, logits: torch.Tensor, seqs: list[Sequence],
                      drafts: list[list[int]]) -> list[list[int]]:
        """5, with draft trees: the chains' rows go through the sampler as in a step without
        trees; each tree keeps the branch that :mod:`samplers.tree_verify` walks (greedy: the
        longest whose every node is the target's argmax after its parent; sampled: SpecInfer's
        multi-candidate rejection, lossless for one-hot drafts), then the token after it. Its
        kept nodes go to ``batch.tree_paths``."""
        bounds, row = [], 0
        for d in drafts:  # (each sampling sequence's rows: its last context position, drafts)
            bounds.append((row, row + len(d) + 1))
            row += len(d) + 1
        trees = [batch.trees[i] for i in batch.sampling]
        out: list[list[int]] = [[] for _ in seqs]
        chains = [j for j, t in enumerate(trees) if t is None]
        if chains:
            rows = torch.tensor([r for j in chains for r in range(*bounds[j])],
                                device=logits.device)
            sampling = SamplingTensors.from_params(
                [seqs[j].params for j in chains], [seqs[j].generator for j in chains],
                self.device, self.generator)
            draft_probs = batch.draft_probs([batch.sampling[j] for j in chains])
            verified = self._sampler_for(sampling).verify(
                logits.index_select(0, rows),
                SpecDecodeMetadata.from_lists([drafts[j] for j in chains], self.device),
                sampling, draft_probs).tolist()
            for j, t in zip(chains, verified, strict=True):
                out[j] = t
        tree_js = [j for j, t in enumerate(trees) if t is not None]
        picked = logits  # [tree rows, vocab_size]
        if chains:
            picked = logits.index_select(0, torch.tensor(
                [r for j in tree_js for r in range(*bounds[j])], device=logits.device))
        finite = torch.isfinite(picked.amax(dim=1)).long()  # [tree rows] usable rows
        choice = None
        if all(seqs[j].params.greedy for j in tree_js):
            # (one sync: each row's argmax and whether the row is usable)
            tokens, finite = torch.stack([picked.argmax(dim=1), finite]).tolist()
        else:  # (sampled trees: every row's multi-candidate rejection at once, one sync)
            sampling = SamplingTensors.from_params([seqs[j].params for j in tree_js],
                                                   None, self.device, self.generator)
            rows = [len(drafts[j]) + 1 for j in tree_js]
            width = max(max(Counter(trees[j]).values()) for j in tree_js)
            cands = torch.tensor([c for j in tree_js
                                  for c in tree_verify.candidates(drafts[j], trees[j], width)],
                                 device=picked.device)  # [tree rows, width]
            probs = logits_to_probs(torch.where(finite[:, None].bool(), picked, 0.0),
                                    sampling, rows)  # [tree rows, vocab_size]
            chosen, drawn = tree_verify.sample_rows(probs, cands, self.generator)
            choice, tokens, finite = torch.stack([chosen, drawn, finite]).tolist()
        offset = 0
        for j in tree_js:
            nodes, parents = drafts[j], trees[j]
            n = len(nodes) + 1
            if not all(finite[offset:offset + n]):
                out[j] = [INVALID_TOKEN_ID]
            else:
                path, out[j] = tree_verify.walk(
                    parents, nodes, None if choice is None else choice[offset:offset + n],
                    tokens[offset:offset + n])
                batch.tree_paths[batch.sampling[j]] = path
            offset += n
        return out

    def _append_and_stop(self, batch: _StepBatch, tokens: list[list[int]],
                         logprob_rows: torch.Tensor | None) -> list[Sequence]:
        """6. Append each sequence's verified tokens with stop checks; finished ones leave (after
        the controller has learnt from their drafts: leaving frees their acceptance rows)."""
        updated, row = [], 0
        for j, (i, out) in enumerate(zip(batch.sampling, tokens, strict=True)):
            seq, num_drafted = batch.items[i].seq, len(batch.drafts[i])
            first, row = row, row + num_drafted + 1  # this sequence's logits rows
            new_tokens = [t for t in out if t != PLACEHOLDER_TOKEN_ID]
            result = _Verified(num_drafted, len(new_tokens) - 1, seq.num_tokens, first,
                               depth=batch.depth(i), path=batch.tree_paths.get(i))
            batch.verified.append(result)
            if j in batch.failed or (out and out[0] == INVALID_TOKEN_ID):
                seq.finish("error", error="non-finite target logits (NaN/inf) or a draft id "
                           "outside the vocabulary at verification")
            else:
                result.kept = append_until_stop(seq, new_tokens, self.eos_token_ids,
                                                self.max_model_len)
                if logprob_rows is not None and seq.logprobs is not None:
                    seq.add_logprobs(logprob_rows[first:first + result.kept],
                                     new_tokens[:result.kept])
                self._account(seq, result)
            updated.append(seq)
        try:
            self._update_policy(batch)
        finally:  # (finished sequences leave whatever happens)
            for seq in updated:
                if seq.is_finished:
                    self._release(seq)
        return updated

    def _hand_features(self, batch: _StepBatch) -> None:
        """A proposer that drafts from the target's features (a draft head) gets each running
        sequence's final hidden states at the positions this forward verified: a prefill
        chunk's, or the fed token's and its accepted drafts' (the rows of the forward's token
        layout, :meth:`_plan_forward`)."""
        if self.proposer is None or not self.proposer.needs_features:
            return
        hidden = self.runner.all_hidden  # [total_new_tokens, hidden_size]
        results = dict(zip(batch.sampling, batch.verified, strict=True))
        updates, offset = [], 0
        gather: list[int] = []  # with trees: every update's rows, in update order
        for i, item in enumerate(batch.items):
            seq, start = item.seq, offset
            offset += item.num_context_tokens + len(batch.drafts[i])
            if seq.is_finished:
                continue
            result = results.get(i)
            count = item.num_context_tokens + (result.num_accepted if result else 0)
            # (a chunk that does not sample has already counted its tokens as computed)
            first = (result.num_tokens_before if result else seq.num_computed_tokens) \
                - item.num_context_tokens
            if batch.runner_trees is not None:
                rows = list(range(start, start + item.num_context_tokens))
                if result is not None and result.path is not None:  # the accepted branch's
                    rows += [start + item.num_context_tokens + c
                             for c in result.path[:result.num_accepted]]
                else:
                    rows = list(range(start, start + count))
                start = len(gather)
                gather += rows
            updates.append(FeatureUpdate(seq.seq_id, first, count, seq.all_token_ids, start))
        if gather and hidden is not None and gather != list(range(len(gather))):
            hidden = hidden.index_select(0, torch.tensor(gather, device=hidden.device))
        if updates and hidden is not None:  # (each update names its rows: no gather, no copy)
            self.proposer.on_features(updates, hidden)

    def _update_policy(self, batch: _StepBatch) -> None:
        """The speculation controller learns the step's acceptance, all sequences at once (a
        step without a proposal teaches it nothing)."""
        if not batch.proposed:
            return
        done = [(i, r) for i, r in zip(batch.sampling, batch.verified, strict=True)
                if batch.items[i].seq.finish_reason != "error"]
        # (a tree's acceptance is its own sequence's: new requests, which may land in batches
        # too large for trees, start from the chains' rate)
        self.spec_policy.update([batch.items[i].seq for i, _ in done],
                                [r.depth for _, r in done],
                                [r.num_accepted for _, r in done],
                                [batch.backed[i] for i, _ in done],
                                [r.path is not None for _, r in done]
                                if batch.runner_trees is not None else None)

    def _rollback(self, batch: _StepBatch) -> None:
        """7. Cut each running sequence's target cache back to its kept context (the newest
        token stays uncached: it is fed next step) and tell the proposer what was kept."""
        if batch.runner_trees is not None:  # (each tree's accepted branch, next to the context)
            self.runner.keep_paths([
                (seq.slot, result.num_tokens_before, result.path)
                for i, result in zip(batch.sampling, batch.verified, strict=True)
                for seq in [batch.items[i].seq]
                if result.path is not None and not seq.is_finished])
        for i, result in zip(batch.sampling, batch.verified, strict=True):
            seq = batch.items[i].seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens = seq.num_tokens - 1
            self.runner.truncate(seq.slot, seq.num_computed_tokens)
            if result.num_drafted and self.proposer is not None:
                self.proposer.on_accepted(
                    seq.seq_id, result.num_tokens_before + min(result.num_accepted, result.kept))

    def _account(self, seq: Sequence, result: _Verified) -> None:
        now = time.perf_counter()
        m = seq.metrics
        m.num_drafted += result.depth  # (a tree: its levels, the most it can accept)
        m.num_accepted += result.num_accepted
        m.num_steps += 1
        m.num_generated += result.kept
        if m.first_token_time is None:
            m.first_token_time = now
        if seq.is_finished:
            m.finished_time = now
        self.metrics.record_request_step(result.depth, result.num_accepted, result.kept)

    def _record(self, batch: _StepBatch, start: float) -> None:
        """The step's timings, for the metrics and the speculation controller's step costs
        (decode steps only, timed like the steps after them: see
        ``ModelRunner.last_step_steady``)."""
        end = time.perf_counter()
        self._proposed_last_step = batch.proposed or batch.observed
        if (batch.verified_at and self.runner.last_step_steady
                and all(item.samples and item.num_context_tokens == 1 for item in batch.items)):
            self.spec_policy.record_step(batch.items, batch.levels(),
                                         end - start - batch.propose_s,
                                         batch.propose_s if batch.typical_proposal else None,
                                         batch.propose_s if batch.after_idle else None,
                                         self.runner.last_packed_rows, self.runner.last_kv_len)
        self.metrics.record_step(end - start, batch.propose_s, end - batch.target_start,
                                 batch.num_draft_steps if batch.typical_proposal else 0)
