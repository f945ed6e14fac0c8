"""The overlapped steps of :class:`engine.llm_engine.LLMEngine` (``EngineConfig.async_scheduling``):
launching a step before the one in flight is read, and committing that one while the device runs
the next (:mod:`engine.overlap` says what a flight is and when the next step can be launched).

Plain flights sample ahead (:meth:`OverlappedSteps._sample_ahead`); drafting flights verify ahead
and have the proposer draft their successor on the device (:meth:`OverlappedSteps._verify_ahead`).
The step after a flight is launched from it (:meth:`OverlappedSteps._launch_next`): a plain step
fed its tokens (``FedTokens``), a drafting step fed its chains (``FedChains``,
:meth:`OverlappedSteps._launch_chained`), or a drafting step after a plain one, from drafts the
proposer makes from it (:meth:`OverlappedSteps._launch_drafting`). A mixin: the methods use the
engine's parts (runner, proposer, controller, scheduler, samplers) and its commit stages, and
live here so that the engine's module reads as the synchronous step's stages.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import torch

from engine.flight_commit import FlightCommit, commit_chains, commit_plain
from engine.forward_inputs import non_finite_rows
from engine.logprobs import to_values
from engine.overlap import (
    FlightLogprobs,
    InFlight,
    Pending,
    next_sequences,
    samples_ahead,
)
from engine.runner import FedChains, FedTokens, ForwardOutput
from engine.runner.kv_cache import KVCacheFull
from engine.sequence import Sequence
from engine.step_records import Forwarded, Proposed, SeqStep, Verified
from samplers import PLACEHOLDER_TOKEN_ID, SamplingTensors
from samplers.chain_accept import accept_chains
from samplers.greedy import argmax_tokens
from samplers.logits_processing import process_logits
from samplers.metadata import SpecDecodeMetadata
from samplers.slot_adjustments import Adjusted, AdjustedChains, AdjustedRow
from scheduler import DraftPlan


class OverlappedSteps:
    """:class:`~engine.llm_engine.LLMEngine`'s flights (see the module docstring)."""

    def _overlaps(self, forwarded: Forwarded | None, proposed: Proposed) -> bool:
        """The step can sample ahead (:mod:`engine.overlap`): every sequence in it samples one
        token, without drafts, from logits that need nothing of the host
        (:func:`~engine.overlap.samples_ahead`)."""
        return (self.overlap and forwarded is not None and forwarded.logits is not None
                and not proposed.asked
                and all(item.samples and not item.drafts and samples_ahead(item.seq)
                        for item in forwarded.items))

    def _overlaps_hosted(self, forwarded: Forwarded | None, proposed: Proposed) -> bool:
        """The step can be sampled on the device without reading its tokens back, its
        sequences' logits processed by the host first (a grammar's mask, penalties; their
        logprobs gathered there too): every sequence samples one token without drafts. Its
        successors are launched before it is committed and sampled after that
        (:class:`Pending`)."""
        return (self.overlap and forwarded is not None and forwarded.logits is not None
                and not proposed.asked
                and all(item.samples and not item.drafts for item in forwarded.items))

    def _overlaps_drafting(self, forwarded: Forwarded | None, proposed: Proposed) -> bool:
        """The drafting step can verify ahead and its successor draft on the device
        (:mod:`engine.overlap`): a proposer that drafts there, every sequence decoding one token
        plus a chain of one length ``k >= 1`` (no tree, no forced drafts, no draft
        probabilities: the head's one-hot drafts) and needing nothing of the host to verify."""
        if not (self.overlap and forwarded is not None and forwarded.logits is not None
                and proposed.asked and self.proposer is not None
                and self.proposer.drafts_on_device):
            return False
        k = len(forwarded.items[0].drafts)
        return k > 0 and all(
            item.samples and item.num_context_tokens == 1 and len(item.drafts) == k
            and item.parents is None and not item.forced and item.draft_probs is None
            and self._drafts_ahead(item.seq) for item in forwarded.items)

    def _drafts_ahead(self, seq: Sequence) -> bool:
        """``seq`` may verify in a drafting flight and have the proposer draft its next drafts
        on the device (:func:`engine.overlap.samples_ahead`), where those drafts are what the
        host would draft: not a request with adjustments whose proposer adjusts its drafts on
        the host only (``Proposer.adjusts_drafts``)."""
        return samples_ahead(seq) and not (seq.adjuster.active and self.proposer.adjusts_drafts)

    def _chain_sampling(self, seqs: list[Sequence]) -> SamplingTensors:
        """The sampling tensors of a drafting flight launched from the host (nothing in
        flight); an all-greedy batch's are made once a batch size (no copy a step)."""
        if any(s.params.temperature != 0.0 for s in seqs):
            return self._sampling_tensors(seqs)
        sampling = self._greedy_sampling.get(len(seqs))
        if sampling is None:
            sampling = self._greedy_sampling[len(seqs)] = self._sampling_tensors(seqs)
        return sampling

    def _verify_ahead(self, forwarded: Forwarded, plan_step: int, base: torch.Tensor,
                      base_hi: list[int], drafted: torch.Tensor,
                      sampling: SamplingTensors, began: torch.cuda.Event | None = None,
                      ahead: bool = False, holds: object = None,
                      fed: torch.Tensor | None = None) -> InFlight:
        """Verify a drafting step's chains on the device (``drafted [batch, k]``: their drafts,
        a view of the chains is enough (the head's are its argmax: one-hot, draft_probs None,
        exact for sampling too); each
        sequence's fed token at position ``base[b]``, at most ``base_hi[b]``; ``sampling``: its
        requests' tensors, seeded ones keyed at this step's output positions), have the
        proposer draft the next step from what they gave, and queue the tokens' copy to the
        host: a drafting flight (its tokens ``[batch, k + 1]``). Penalized sequences' rows are
        adjusted from their slots' state first (:meth:`_adjust_chains`: ``holds``, the mark of
        the flight the chains are fed from; ``fed [batch]``, a plain flight's tokens they
        follow), and the tokens kept raise their counts."""
        seqs = [item.seq for item in forwarded.items]
        raw = (forwarded.logits.clone() if self.config.logprobs_mode.startswith("raw")
               and any(s.logprobs is not None and s.adjuster.active for s in seqs) else None)
        adjusted = self._adjust_chains(forwarded.logits, seqs, drafted, holds, fed, base)
        try:
            return self._verified_ahead(forwarded, plan_step, base, base_hi, sampling, began,
                                        ahead, drafted, adjusted, raw)
        except BaseException:  # (a step dropped after counting its tokens: counted again)
            if adjusted is not None:
                adjusted.forget()
            raise

    def _adjust_chains(self, logits: torch.Tensor, seqs: list[Sequence], drafts: torch.Tensor,
                       holds: object, fed: torch.Tensor | None,
                       base: torch.Tensor) -> AdjustedChains | None:
        """Adjust in place the chains of ``logits [batch * width, vocab_size]`` whose sequences
        have adjustments, from their slots' state (``drafts [batch, width - 1]``, ``base
        [batch]`` each chain's fed position, where a ``min_tokens`` still ahead masks; see
        :meth:`_verify_ahead`); None when none has one."""
        rows = [AdjustedRow(j, seq.slot, seq, seq.adjuster, seq.output_token_ids,
                            None if fed is None else j, holds, seq.num_prompt_tokens)
                for j, seq in enumerate(seqs) if seq.adjuster.active and not seq.is_finished]
        if not rows:
            return None
        return self.slot_adjustments.apply_chains(logits, rows, drafts, fed, base)

    def _verified_ahead(self, forwarded: Forwarded, plan_step: int, base: torch.Tensor,
                        base_hi: list[int], sampling: SamplingTensors,
                        began: torch.cuda.Event | None, ahead: bool, drafted: torch.Tensor,
                        adjusted: AdjustedChains | None,
                        raw: torch.Tensor | None) -> InFlight:
        """:meth:`_verify_ahead` once its logits are adjusted (``raw``: a copy from before,
        where logprobs are raw and rows were adjusted)."""
        items = forwarded.items
        width = drafted.shape[1] + 1
        failed = non_finite_rows(forwarded.logits, [item.drafts for item in items])  # (CPU)
        sampler = (self.greedy_sampler if self.greedy_sampler is not None and sampling.all_greedy
                   else self.sampler)
        # [batch, width]: accepted drafts, then the recovered or bonus token, then placeholders;
        # [batch] the drafts accepted; [batch, 1] the last token; [batch] the next fed position
        # (a graph's own argmax is of the logits unadjusted)
        argmax = forwarded.output.argmax if adjusted is None else None
        features = self._features(forwarded.output)
        ids = [item.seq.seq_id for item in items]
        drafts = None
        if sampler is self.greedy_sampler and argmax is not None:  # (the graph's argmax: one
            # launch decides every chain, in the proposer's graph of the next drafts where it
            # has one)
            (tokens, accepted, last, nxt), drafts = self.proposer.verify_and_draft(
                ids, features, partial(accept_chains, vocab_size=forwarded.logits.shape[1]),
                (argmax, drafted, base), base, base_hi, self._chain_drafts(width))
        else:
            if sampler is self.greedy_sampler and self._greedy_chains is not None:
                tokens = self._greedy_chains.verify(forwarded.logits, drafted, sampling)
            elif sampler is self.sampler:
                tokens, forwarded = self._sample_chains(forwarded, drafted, sampling)
            else:
                tokens = sampler.verify(forwarded.logits, SpecDecodeMetadata.uniform(drafted),
                                        sampling, None)
            accepted = ((tokens != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1).clamp(0, width - 1)
            last, nxt = tokens.gather(1, accepted[:, None]).clamp_min(0), base + accepted + 1
        if adjusted is not None:  # (the next chains' penalties count the tokens kept)
            adjusted.count(tokens, accepted)
        logprobs = self._chain_logprobs(forwarded.logits if raw is None else raw, tokens,
                                        [item.seq for item in items], width)
        if drafts is None:
            drafts = self.proposer.draft_after(ids, features, tokens, accepted, base, base_hi,
                                               self._chain_drafts(width))
        chain = (torch.cat([last, drafts], dim=1), nxt)
        host, copied = self._token_copies.start(tokens.reshape(-1))
        # (the next flight's sampling: each request made accepted + 1 tokens; keyed rows move)
        advanced = sampling if sampling.keys is None else sampling.advanced(accepted + 1)
        return InFlight(forwarded, tokens, host, copied, failed, plan_step, ahead, began,
                        width, chain, features, advanced, ahead, logprobs=logprobs,
                        counted=None if adjusted is None else adjusted.mark)

    def _chain_drafts(self, width: int) -> int:
        """The drafts a drafting flight of ``width`` has the proposer make for the step after
        it: a free proposer's (the draft head's graph drafts its k whatever is asked for;
        n-gram looks up) the configured k, so that the next step verifies as many as the
        controller chooses then (``device_width``); a costly one's the flight's own."""
        return self.max_chain_drafts if self.proposer.drafts_are_free else width - 1

    def _chain_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, seqs: list[Sequence],
                        width: int) -> FlightLogprobs | None:
        """A drafting flight's logprobs (None when no sequence asks): every row of the chains
        of ``seqs`` that ask (``logits [batch * width, vocab_size]``, the verified ``tokens
        [batch, width]``, placeholders past each chain's last token), raw or processed as the
        synchronous step gives them (``LLMEngine._verify``: the rows processed alone, each by
        its own request's parameters); the commit reads the rows of the tokens it keeps."""
        asking = [j for j, seq in enumerate(seqs) if seq.logprobs is not None]
        if not asking:
            return None
        rows = [j * width + i for j in asking for i in range(width)]
        index = self.runner.to_device(rows)
        values = logits.index_select(0, index)
        mode = self.config.logprobs_mode
        if not mode.startswith("raw"):
            values = process_logits(values, self._sampling_tensors([seqs[j] for j in asking]),
                                    [width] * len(asking))
        k = min(max(seqs[j].params.logprobs for j in asking), logits.shape[1])
        return FlightLogprobs.of(rows, to_values(values, mode),
                                 tokens.reshape(-1).index_select(0, index), k)

    def _overlapped(self, start: float) -> list[Sequence]:
        """Launch the step after the one in flight from its tokens on the device, when that
        step is the same sequences decoding again; then commit the one in flight while the
        device runs the next."""
        flight = self._in_flight
        if isinstance(flight, Pending):  # (a raise after its launch left it unsampled)
            flight = self._in_flight = self._sample_hosted(flight)
        self._in_flight = nxt = self._launch_next(flight)  # (a raise leaves it to commit)
        if nxt is not None and nxt.pairs_written:  # (the head has the flight's pairs)
            self._proposed_last_step = True
        elif nxt is not None:  # (a proposer keeping state of the text sees it)
            self._observe(nxt.forwarded.items, Proposed(nxt.chain is not None))
        # (the step before's outcome, with the next few, once the next step is launched: the
        # device runs it meanwhile, and the plan just made lags one more step)
        try:
            self._learn(defer=True)
        except BaseException:  # (``flight`` is committed still: the next step commits
            # ``nxt``, fed from its tokens; what it updated, the next step reports)
            self._finished_outside_step.extend(self._commit_flight(flight, start))
            raise
        updated = self._commit_flight(flight, start)
        if isinstance(nxt, Pending) and self._in_flight is nxt:  # (not every one stopped)
            try:
                self._in_flight = self._sample_hosted(nxt)
            except BaseException:  # (what the commit updated is reported by the next step)
                self._finished_outside_step.extend(updated)
                raise
        return updated

    def _launch_next(self, flight: InFlight) -> InFlight | Pending | None:
        """The next step launched before ``flight``'s tokens are read, each sequence's input
        its flight token on the device (None: it cannot be; see
        :func:`engine.overlap.next_sequences`); :class:`Pending` when its sampling needs
        ``flight``'s commit first."""
        if flight.host_next:
            return None
        scheduler = self.scheduler
        waiting = bool(scheduler.waiting)
        # (a request waiting for a slot while every slot is taken cannot be admitted before a
        # sequence finishes, which the host learns at the commit: the batch goes on ahead)
        admissible = waiting and len(scheduler.running) < scheduler.max_num_seqs
        seqs = next_sequences(flight, scheduler.running, admissible, self.runner.num_free_tokens,
                              self.max_model_len)
        if seqs is None:
            return None
        # (the controller plans the step: plain, or not launched ahead)
        plan = self.controller.plan(scheduler.running, waiting)
        if flight.chain is not None:
            return self._launch_chained(flight, seqs, plan)
        if self.proposer is not None and any(plan.drafts_for(seq) for seq in seqs):
            if not self._drafts_after_plain(flight, seqs, plan):
                self._planned = plan  # (the step's plan: _schedule takes it)
                return None
            k = self.controller.device_width(seqs, plan, 1)  # (the flight's token: one)
            if k:
                return self._launch_drafting(flight, seqs, plan, k)
            # (the controller's width for drafts made on the device is none: a plain step)
        self._proposed_last_step = False
        # (the flight's pairs into the draft head's cache on the device, first: a raise here
        # leaves nothing taken; the head learns of them when the flight commits)
        written = self._writes_pairs(flight, seqs)
        if written:
            self._write_pairs(flight, seqs)
        # (a row the kernels marked INVALID_TOKEN_ID is fed as id 0: its sequence fails when
        # the flight commits, and this step's token for it is dropped)
        fed = FedTokens(flight.tokens, flight.rows_of(seqs))
        began = self._flight_start()
        started = time.perf_counter()
        try:
            out = self.runner.forward([seq.slot for seq in seqs], [[0]] * len(seqs),
                                      keep_hidden=self.keep_hidden, fed=fed)
        except BaseException:  # (rows the runner took for the step go back)
            for seq in seqs:
                self.runner.truncate(seq.slot, seq.num_tokens)
            raise
        forwarded = Forwarded([SeqStep(seq, 1, True) for seq in seqs], out, out.logits, started)
        if not all(samples_ahead(seq) for seq in seqs):  # (sampled once the flight commits)
            return Pending(forwarded, plan.step, began, written)
        try:
            nxt = self._sample_ahead(forwarded, plan.step, self._next_sampling(flight, seqs),
                                     began, ahead=True, fed=fed)
        except BaseException:  # (the step is dropped: its rows go back, as above)
            for seq in seqs:
                self.runner.truncate(seq.slot, seq.num_tokens)
            raise
        return replace(nxt, pairs_written=True) if written else nxt

    def _writes_pairs(self, flight: InFlight, seqs: list[Sequence]) -> bool:
        """The step after plain flight ``flight`` writes the flight's pairs into the draft
        head's cache on the device (``Proposer.write_after``), instead of the host handing it
        the flight's features when the flight commits: a head that takes them there, the
        flight's features kept (one row a sequence), and every one of ``seqs`` covered up to
        the flight's fed token."""
        return (self.proposer is not None and self.proposer.pairs_on_device
                and self.keep_hidden and flight.forwarded.output.hidden is not None
                and all(item.num_context_tokens == 1 for item in flight.forwarded.items)
                and all(self.proposer.ready_on_device(seq.seq_id, seq.num_tokens)
                        for seq in seqs))

    def _write_pairs(self, flight: InFlight, seqs: list[Sequence]) -> None:
        """Plain flight ``flight``'s pairs of ``seqs`` (each one's feature at its fed token,
        ``num_tokens - 1``, with the token the flight sampled) into the draft head's cache on
        the device (``Proposer.write_after``)."""
        features, tokens = self._features(flight.forwarded.output), flight.tokens
        if len(seqs) < len(flight.sequences):
            index = self.runner.to_device(flight.rows_of(seqs))
            features, tokens = features.index_select(0, index), tokens.index_select(0, index)
        self.proposer.write_after([seq.seq_id for seq in seqs], features, tokens,
                                  [seq.num_tokens - 1 for seq in seqs])

    def _launch_chained(self, flight: InFlight, seqs: list[Sequence],
                        plan: DraftPlan) -> InFlight | None:
        """The step after drafting flight ``flight``, launched from its chains on the device
        (:class:`FedChains`): a drafting step when the plan drafts for every one of ``seqs``,
        each verifying the first ``k`` drafts of its chain (the controller's ``device_width``;
        more than the flight's only where every sequence has room for them), a plain one (each
        sequence's recovered or bonus token, its sample taken ahead) when it drafts for none
        of them, or when ``device_width`` chooses none; otherwise the plan is kept for the
        synchronous step."""
        wanted = [plan.drafts_for(seq) > 0 for seq in seqs]
        if any(wanted) and not all(wanted):
            self._planned = plan
            return None
        # (penalized sequences' counts hold the flight's kept tokens, which the host's output
        # lacks, so a count made again from it would miss them: the step asks for the mark)
        if any(seq.adjuster.active and seq.params.needs_penalties
               and self.slot_adjustments.counted.get(seq.slot) is not flight.counted
               for seq in seqs):
            self._planned = plan
            return None
        # (the flight in flight brings each sequence at least one token nearer its end)
        k = self.controller.device_width(seqs, plan, 1) if any(wanted) else 0
        width = flight.width  # (the most the flight advances a sequence)
        if k >= width and (  # (wider than the flight: only where the context and cache allow)
                any(seq.num_tokens - 1 + width + k + 1 > self.max_model_len for seq in seqs)
                or len(seqs) * (k + 1) > self.runner.num_free_tokens):
            k = width - 1  # (the flight's own width has room: next_sequences)
        k = min(k, flight.chain[0].shape[1] - 1)  # (the drafts the chains hold)
        plain = not k
        self._proposed_last_step = not plain
        tokens, base = flight.chain  # [batch, 1 + drafts], [batch] on the device
        tokens = tokens[:, :k + 1]
        sampling = flight.sampling
        if len(seqs) < len(flight.sequences):  # (the rows of the sequences that go on)
            rows = flight.rows_of(seqs)
            index = self.runner.to_device(rows)
            tokens, base = tokens.index_select(0, index), base.index_select(0, index)
            sampling = self._sampling_of(sampling, rows, index)
        # (the flight's fed token sits at num_tokens - 1, and it advances at most width)
        base_hi = [seq.num_tokens - 1 + width for seq in seqs]
        began = self._flight_start()
        started = time.perf_counter()
        fed = FedChains(tokens[:, :1] if plain else tokens, base, base_hi)
        try:
            out = self.runner.forward_chains([seq.slot for seq in seqs], fed,
                                             keep_hidden=self.keep_hidden)
        except KVCacheFull:  # (nothing taken: the step runs from the host after the commit)
            return None
        except BaseException:  # (rows the runner took go back to the flight's)
            for seq in seqs:
                self.runner.truncate(seq.slot, min(self.runner.seq_len(seq.slot),
                                                   seq.num_tokens - 1 + width))
            raise
        if plain:  # (a plain flight: its features go to the head when it commits)
            forwarded = Forwarded([SeqStep(seq, 1, True) for seq in seqs], out, out.logits,
                                  started)
            # (a min_tokens still ahead is masked by where each chain sits: base)
            return replace(self._sample_ahead(forwarded, plan.step,
                                              None if sampling.all_greedy else sampling, began,
                                              True, holds=flight.counted, base=base),
                           reserved=True)
        items = [SeqStep(seq, 1, True, k, [PLACEHOLDER_TOKEN_ID] * k, depth=k) for seq in seqs]
        forwarded = Forwarded(items, out, out.logits, started)
        return self._verify_ahead(forwarded, plan.step, base, base_hi, tokens[:, 1:], sampling,
                                  began, ahead=True, holds=flight.counted)

    def _drafts_after_plain(self, flight: InFlight, seqs: list[Sequence],
                            plan: DraftPlan) -> bool:
        """The plan drafts for every one of ``seqs`` after plain flight ``flight``, and the
        proposer can draft from the flight on the device (:meth:`_launch_drafting`)."""
        return (self.proposer.drafts_on_device
                and (flight.forwarded.output.hidden is not None or not self.keep_hidden)
                and all(item.num_context_tokens == 1 for item in flight.forwarded.items)
                and all(plan.drafts_ahead(seq, 1) > 0 and self._drafts_ahead(seq)
                        and self.proposer.ready_on_device(seq.seq_id, seq.num_tokens)
                        for seq in seqs))

    def _launch_drafting(self, flight: InFlight, seqs: list[Sequence],
                         plan: DraftPlan, k: int) -> InFlight | None:
        """The drafting step after plain flight ``flight``, launched before its tokens are
        read: the proposer drafts on the device from the flight's token and features (each
        sequence's fed token at ``num_tokens - 1``, its sampled one next), and the step feeds
        that token and the drafts (:class:`FedChains`, positions known here). None when the
        KV cache cannot hold the drafts (the step then runs from the host). ``k``: the drafts
        a sequence verifies (``device_width``)."""
        if any(seq.num_tokens + k >= self.max_model_len for seq in seqs):  # (one width for all:
            self._planned = plan  # a short cap elsewhere may not bring it past the context)
            return None
        self._proposed_last_step = True
        rows = flight.rows_of(seqs)
        features = self._features(flight.forwarded.output)  # [n, width] (None: not needed)
        fed = [seq.num_tokens - 1 for seq in seqs]  # (the flight's fed tokens' positions)
        # (one copy: the rows of the sequences that go on, then those positions)
        index = self.runner.to_device(rows + fed)
        rows_t, fed_t = index[:len(rows)], index[len(rows):]
        sampled = flight.tokens.index_select(0, rows_t).clamp_min(0)[:, None]  # [batch, 1]
        sampling = self._next_sampling(flight, seqs) or self._chain_sampling(seqs)
        ids = [seq.seq_id for seq in seqs]
        self.proposer.flush(ids, [seq.all_token_ids for seq in seqs])
        drafts = self.proposer.draft_after(ids, None if features is None
                                           else features.index_select(0, rows_t), sampled,
                                           torch.zeros_like(fed_t), fed_t, fed, k)
        base_hi = [p + 1 for p in fed]
        base = fed_t + 1
        began = self._flight_start()
        started = time.perf_counter()
        tokens = torch.cat([sampled, drafts], dim=1)  # [batch, k + 1]
        try:
            out = self.runner.forward_chains([seq.slot for seq in seqs],
                                             FedChains(tokens, base, base_hi),
                                             keep_hidden=self.keep_hidden)
        except KVCacheFull:  # (nothing taken; the flushed pairs stay the head's)
            self._planned = plan
            return None
        except BaseException:  # (rows the runner took go back to the flight's)
            for seq in seqs:
                self.runner.truncate(seq.slot, min(self.runner.seq_len(seq.slot),
                                                   seq.num_tokens))
            raise
        items = [SeqStep(seq, 1, True, k, [PLACEHOLDER_TOKEN_ID] * k, depth=k) for seq in seqs]
        forwarded = Forwarded(items, out, out.logits, started)
        return self._verify_ahead(forwarded, plan.step, base, base_hi, drafts, sampling, began,
                                  True, fed=sampled.view(-1))

    def _flight_start(self) -> torch.cuda.Event | None:
        """An event recorded before a flight's forward is queued, for its device time
        (:meth:`InFlight.device_seconds`, what the controller prices a flight at); None off
        CUDA, or for a controller that learns nothing (each record is host time a step)."""
        if self.device.type != "cuda" or not self.controller.learns:
            return None
        began = torch.cuda.Event(enable_timing=True)
        began.record(torch.cuda.current_stream(self.device))
        return began

    def _features(self, out: ForwardOutput) -> torch.Tensor | None:
        """The target features a proposer that drafts on the device reads (its
        ``feature_layers``' inputs, else the final hidden states; None when it reads none:
        n-gram)."""
        if not self.keep_hidden:
            return None
        return out.aux_hidden if self.proposer.feature_layers else out.hidden

    def _sampling_of(self, sampling: SamplingTensors, rows: list[int],
                     index: torch.Tensor) -> SamplingTensors:
        """A drafting flight's sampling tensors of its ``rows`` that go on (``index``: the same
        on the device): where all of them are greedy, the greedy tensors of that many requests,
        made once a batch size from the first such rows (any greedy rows stand for any others:
        a closed batch's tail meets each size and would select six tensors at every step it
        shrinks), else the rows selected on the device."""
        selected = None
        if not sampling.all_greedy:
            selected = sampling.select(rows, index)
            if not selected.all_greedy:
                return selected
        cached = self._greedy_sampling.get(len(rows))
        if cached is None:
            if selected is None:
                selected = sampling.select(rows, index)
            # (greedy rows filter nothing: not the flags that select keeps of a mixed batch)
            cached = self._greedy_sampling[len(rows)] = replace(
                selected, max_top_k=0, any_top_p=False, any_min_p=False)
        return cached

    def _next_sampling(self, flight: InFlight, seqs: list[Sequence]) -> SamplingTensors | None:
        """The sampling tensors of the step after plain flight ``flight`` for ``seqs`` (its
        sequences that go on): the flight's own, their keyed positions already moved on on the
        device (none when all are greedy). Nothing is copied from the host: a copy from pageable
        memory would wait for the flight."""
        sampling = flight.sampling
        if sampling is None or len(seqs) == len(flight.sequences):
            return sampling
        rows = flight.rows_of(seqs)
        if all(sampling.greedy[j] for j in rows):  # (the sampled ones left: one argmax)
            return None
        return sampling.select(rows, self.runner.to_device(rows))

    def _flight_sampling(self, seqs: list[Sequence]) -> SamplingTensors | None:
        """The sampling tensors of a flight of ``seqs`` launched from the host (nothing in
        flight); None when all are greedy (one argmax samples them)."""
        if all(s.params.temperature == 0.0 for s in seqs):
            return None
        return self._sampling_tensors(seqs)

    def _sample_ahead(self, forwarded: Forwarded, plan_step: int,
                      sampling: SamplingTensors | None, began: torch.cuda.Event | None = None,
                      ahead: bool = False, fed: FedTokens | None = None,
                      raw: torch.Tensor | None = None, holds: object = None,
                      base: torch.Tensor | None = None) -> InFlight:
        """Sample one token per sequence of ``forwarded`` on the device (``sampling`` None: the
        argmax, which a decode step's CUDA graph computed already, else two kernels) and queue
        their copy to the host; ``ahead``: launched before the step before it was committed;
        ``began``: recorded before its forward (CUDA). Adjustments that need no history
        (penalties, bias, allowed ids, min_tokens) come from the slots' state on the device
        (:meth:`_adjust_on_device`; ``fed``: the tokens in flight the forward was fed, the
        last output token of each sequence, not on the host yet; ``holds``: the mark of the
        drafting flight whose chains fed it, which its penalized slots' counts hold, as the host
        cannot count them: :class:`~samplers.slot_adjustments.AdjustedRow`; ``base [batch]``:
        with ``holds``, each sequence's fed token's position on the device, where a
        ``min_tokens`` still ahead masks); logprobs are gathered
        there, from ``raw`` (the forward's logits, where the host processed a copy: None,
        ``forwarded.logits``) or the processed logits, and copied behind the tokens."""
        items = forwarded.items
        seqs = [item.seq for item in items]
        logits = forwarded.logits  # [batch, vocab_size]
        mode = self.config.logprobs_mode
        lp_rows = [j for j, seq in enumerate(seqs) if seq.logprobs is not None]
        lp_index = self.runner.to_device(lp_rows) if lp_rows else None
        values = ((logits if raw is None else raw).index_select(0, lp_index)  # (before any
                  if lp_index is not None and mode.startswith("raw") else None)  # adjustment)
        adjusted = self._adjust_on_device(logits, seqs, fed, holds, base)
        try:
            failed = non_finite_rows(logits, [[] for _ in items])  # (CPU only)
            # (a decode graph's own argmax, where it computed one: of the logits unadjusted)
            argmax = forwarded.output.argmax if adjusted is None else None
            if sampling is None and argmax is not None:  # (the rows of logits: the first)
                tokens = argmax[:len(items)]
            elif sampling is None:
                tokens = argmax_tokens(logits)
            else:  # (no drafts: metadata made on the device, nothing copied from the host)
                nothing = torch.empty((len(items), 0), dtype=torch.long, device=self.device)
                tokens, forwarded = self._sample_chains(forwarded, nothing, sampling)
                tokens = tokens.view(-1)
            if adjusted is not None:  # (the next step's penalties count these tokens)
                adjusted.count(tokens)
            logprobs = None
            if lp_index is not None:  # (their entries' facts, copied behind the tokens)
                if values is None:  # (processed: what the token is drawn from)
                    values = process_logits(logits.index_select(0, lp_index),
                                            self._sampling_tensors([seqs[j] for j in lp_rows]),
                                            [1] * len(lp_rows))
                k = min(max(seqs[j].params.logprobs for j in lp_rows), logits.shape[1])
                logprobs = FlightLogprobs.of(lp_rows, to_values(values, mode),
                                             tokens.index_select(0, lp_index), k)
            host, copied = self._token_copies.start(tokens)
        except BaseException:  # (a step dropped after counting its tokens: counted again)
            if adjusted is not None:
                adjusted.forget()
            raise
        # (the next flight's sampling: one token on, keyed positions moved on on the device)
        return InFlight(forwarded, tokens, host, copied, failed, plan_step, ahead, began,
                        sampling=None if sampling is None else sampling.advanced(1),
                        logprobs=logprobs)

    def _sample_chains(self, forwarded: Forwarded, drafts: torch.Tensor,
                       sampling: SamplingTensors) -> tuple[torch.Tensor, Forwarded]:
        """int64 ``[batch, k + 1]``: ``self.sampler``'s verification of uniform chains (the
        logits of ``forwarded``, ``[batch * (k + 1), vocab_size]``; ``drafts [batch, k]``,
        one-hot; ``k = 0``: a plain step's sampling), replayed from a CUDA graph where the
        engine keeps them (:mod:`samplers.sampled_chains`); and ``forwarded``, marked not
        steady when its sampling ran a layout's first time or its capture (the controller
        does not learn a step's cost from it)."""
        logits = forwarded.logits
        if self._sampled_chains is None:
            return self.sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), sampling,
                                       None), forwarded
        tokens, steady = self._sampled_chains.verify(logits, drafts, sampling)
        if not steady:
            forwarded = replace(forwarded, output=replace(forwarded.output, steady=False))
        return tokens, forwarded

    def _adjust_on_device(self, logits: torch.Tensor, seqs: list[Sequence],
                          fed: FedTokens | None, holds: object = None,
                          base: torch.Tensor | None = None) -> Adjusted | None:
        """Adjust in place the rows of ``logits [batch, vocab_size]`` whose sequences' adjusters
        need no history, from their slots' state on the device
        (:mod:`samplers.slot_adjustments`; ``holds``, ``base``: see :meth:`_sample_ahead`);
        None when no row has one. A sequence that stopped at the commit before (its row
        dropped later) is left as it is."""
        rows = [AdjustedRow(j, seq.slot, seq, seq.adjuster, seq.output_token_ids,
                            None if fed is None else fed.sources[j], holds,
                            seq.num_prompt_tokens)
                for j, seq in enumerate(seqs)
                if seq.adjuster.active and not seq.adjuster.needs_history
                and not seq.is_finished]
        if not rows:
            return None
        return self.slot_adjustments.apply(logits, rows, None if fed is None else fed.values,
                                           base)

    def _sample_hosted(self, pending: Pending, ahead: bool = True) -> InFlight:
        """Sample ``pending``'s tokens on the device once the host knows what its sequences'
        logits need (the flight before it committed): each running sequence's logits masked by
        its grammar at its state after the tokens it has, and adjusted by the host where a
        bad word of several tokens reads them, then sampled as a plain flight's
        (:meth:`_sample_ahead`, which adjusts the others; the forward's own argmax not used). A
        sequence that stopped at that commit is sampled with the others (unmasked, unadjusted)
        and its token dropped when this flight commits. When every
        grammar forces three or more tokens from here, the step after this flight runs from
        the host, which drafts the two or more left after this flight's own
        (``InFlight.host_next``)."""
        forwarded = pending.forwarded
        # [batch, vocab_size]: processed in place on a copy, so that a raise part-way leaves the
        # forward's own for the call that samples it again (the next step's)
        logits = forwarded.logits.clone()
        seqs = [item.seq for item in forwarded.items]
        self.grammar_masks.start(forwarded.items, inline=True)  # (one row a sequence)
        for j, seq in enumerate(seqs):
            if seq.adjuster.needs_history and not seq.is_finished:
                seq.adjuster.apply(logits[j:j + 1], seq.output_token_ids)
        self.grammar_masks.apply(logits)
        output = replace(forwarded.output, argmax=None)  # (of the logits before any of that)
        flight = self._sample_ahead(replace(forwarded, output=output, logits=logits),
                                    pending.plan_step, self._flight_sampling(seqs),
                                    pending.began, ahead, raw=forwarded.logits)
        return replace(flight, pairs_written=pending.pairs_written,
                       host_next=self._forces_tokens(seqs))

    def _forces_tokens(self, seqs: list[Sequence]) -> bool:
        """Every running sequence's grammar forces three or more tokens from its state now
        (the flight being sampled takes the first; the synchronous step after it drafts the
        rest, two or more each for one forward: ``LLMEngine._forced`` drafts no fewer while
        steps overlap), and forced drafts are on. Where some sequences are forced and others
        not, overlapped steps go on: a synchronous step would cost the whole batch its
        overlap for the forced ones' gain."""
        limit = min(self.config.structured_forced_tokens, self.max_grammar_drafts)
        running = [seq for seq in seqs if not seq.is_finished]
        return limit >= 2 and bool(running) and all(
            seq.grammar is not None and len(seq.grammar.forced_tokens(3)) == 3
            for seq in running)

    def _commit_flight(self, flight: InFlight, start: float) -> list[Sequence]:
        """5-6 for a flight: its tokens appended with stop checks, as :meth:`_commit`; the
        sequences the next flight feeds keep the row it writes for their newest token. A
        sequence finished while in flight (aborted) gets nothing. In one pass
        (:mod:`engine.flight_commit`)."""
        if flight.chain is None:
            return self._commit_plain_flight(flight, start)
        return self._commit_chain_flight(flight, start)

    def _ahead(self) -> dict[int, int]:
        """The sequences the flight in flight feeds (id -> its width when it reserved rows past
        their newest token, fed from chains; 0 when fed plainly, holding just its own)."""
        nxt = self._in_flight
        return {} if nxt is None else {id(s): nxt.width if nxt.reserved else 0
                                       for s in nxt.sequences}

    def _commit_plain_flight(self, flight: InFlight, start: float) -> list[Sequence]:
        """:meth:`_commit_flight` for a plain flight (:func:`engine.flight_commit.commit_plain`).
        A draft head learns of each running sequence's pair: where the next flight wrote it on
        the device (``Proposer.advance``), else from the flight's features on the host
        (``_hand_features``)."""
        ahead, nxt = self._ahead(), self._in_flight
        tokens = flight.token_ids()
        done = commit_plain(flight.sequences, tokens, flight.failed, self.eos_token_ids,
                            self.max_model_len, time.perf_counter(), ahead, self.metrics,
                            partial(self._kept_in_flight, flight.logprobs))
        self._leave_flight(done)
        if self.keep_hidden:
            written = ahead if nxt is not None and nxt.pairs_written else {}
            features = self._features(flight.forwarded.output)
            handed = []  # (the running sequences whose pair the head takes from the host)
            for j, item in enumerate(flight.forwarded.items):
                seq = item.seq
                if seq.is_finished:
                    continue
                if id(seq) in written:
                    self.proposer.advance(seq.seq_id, seq.num_tokens - 1, features, j,
                                          tokens[j])
                else:
                    handed.append(Verified(item, [tokens[j]], 0, seq.num_tokens - 1, j))
            if handed:
                self._hand_features(flight.forwarded, handed, written)
        # (nothing proposed, nothing verified for the controller: it learns the step's cost
        # and who left)
        self._record_flight(flight, start, Proposed(), [], done.finished)
        return done.updated

    def _kept_in_flight(self, logprobs: FlightLogprobs | None, seq: Sequence, row: int,
                        tokens: list[int]) -> None:
        """A flight's sequence kept ``tokens`` from flight row ``row`` on (a plain flight's
        one; a drafting flight's accepted drafts and its recovered or bonus token, up to a
        stop): its grammar accepts them (which may finish it) and it gets their logprobs, as
        the synchronous commit does (``LLMEngine._commit``)."""
        if seq.grammar is not None:
            self._advance_grammar(seq, tokens)
        if seq.logprobs is not None and tokens:
            seq.append_logprobs(logprobs.entries(row, tokens, seq.params.logprobs,
                                                 seq.tokenizer), tokens)

    def _commit_chain_flight(self, flight: InFlight, start: float) -> list[Sequence]:
        """:meth:`_commit_flight` for a drafting flight: the same effects in one pass
        (:func:`engine.flight_commit.commit_chains`); the proposer learns where each running
        sequence got (its drafts were made on the device, from the flight's features)."""
        ahead = self._ahead()
        items, width = flight.forwarded.items, flight.width
        rows = flight.token_rows()
        done = commit_chains(
            [item.seq for item in items], rows, width - 1, flight.failed, self.eos_token_ids,
            self.max_model_len, time.perf_counter(), ahead, self.metrics,
            self.proposer.on_accepted if self.proposer is not None else None,
            None if flight.logprobs is None else partial(self._kept_in_flight, flight.logprobs))
        self._leave_flight(done)
        verified = []  # (what the controller learns: each verified row's item and drafts kept;
        # its tokens before the step are not read there, the commit settled its cache)
        for j, accepted in done.verified:
            item = items[j]
            verified.append(Verified(item, rows[j][:accepted + 1], accepted, 0, j * width))
            seq = item.seq
            if not seq.is_finished:
                self.proposer.advance(seq.seq_id, seq.num_tokens - 1, flight.features,
                                      j * width + accepted, rows[j][accepted])
        # (its drafts were made on the device: no proposal time of their own)
        self._record_flight(flight, start, Proposed(True, draft_steps=width - 1), verified,
                            done.finished)
        return done.updated

    def _leave_flight(self, done: FlightCommit) -> None:
        """A committed flight's cache rows back, and its finished sequences out."""
        for slot, num_rows in done.truncations:
            self.runner.truncate(slot, num_rows)
        for seq in done.finished:
            self._release(seq, controller=False)

    def _record_flight(self, flight: InFlight, start: float, proposed: Proposed,
                       verified: list[Verified], updated: list[Sequence]) -> None:
        """6 for a committed flight: its step's record, at the flight's cost."""
        forwarded, seconds = flight.forwarded, flight.device_seconds()
        # (a flight's cost for the controller is what it costs when steps overlap: the
        # pipeline's period, a call that commits a step launched ahead and launches the next,
        # and at least the flight's device time on CUDA; another call's duration holds part of
        # a synchronous step, or leaves out the flight's own forward, so there only the device
        # time counts. The device time alone priced a host-bound step at its kernels, below
        # its period: plain steps then looked cheaper next to drafting ones than they were)
        if flight.ahead and self._in_flight is not None:
            seconds = max(seconds or 0.0, time.perf_counter() - start)
        elif seconds is None:
            forwarded = replace(forwarded, output=replace(forwarded.output, steady=False))
        self._forget_finished_flight()  # (every one of them stopped)
        self._record(forwarded, proposed, verified, updated, start, flight.plan_step, seconds)
