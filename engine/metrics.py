"""Engine-wide speculation and throughput counters, turned into :class:`EngineMetrics`."""

from __future__ import annotations

from engine.outputs import EngineMetrics
from scheduler import expected_tokens

# Weight of the newest sample in the running draft/target cost-ratio estimate.
_COST_EMA = 0.1


def predicted_speedup(alpha: float, k: float, c: float) -> float:
    """Leviathan et al. (arXiv 2211.17192, eq. 1): expected walltime improvement of speculative
    decoding with per-token acceptance ``alpha``, ``k`` drafts per step and draft/target cost
    ratio ``c``: ``(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``.

    >>> round(predicted_speedup(0.8, 4, 0.05), 3)
    2.801
    """
    return expected_tokens(alpha, k) / (k * c + 1.0)


class MetricsCollector:
    """Counts drafted / accepted / tested tokens (overall and per draft position), generated
    tokens, steps and time; keeps a running estimate of the draft/target cost ratio."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.reset()
        self.draft_cost_ratio = 0.0  # survives resets: it describes the models, not a run

    def reset(self) -> None:
        self.num_requests = 0
        self.num_generated = 0
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_tested = 0
        self.num_steps = 0
        self.num_spec_request_steps = 0
        self.num_spec_generated = 0
        self.num_preemptions = 0
        self.elapsed_s = 0.0
        self.drafted_at = [0] * self.max_k
        self.accepted_at = [0] * self.max_k
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def record_prefix_lookup(self, num_queried: int, num_hit: int) -> None:
        """A prefix-cache lookup at admission: context tokens looked up, tokens found."""
        self.prefix_cache_queries += num_queried
        self.prefix_cache_hits += num_hit

    def record_request_step(self, num_drafted: int, num_accepted: int, num_appended: int) -> None:
        """One request's verified step: ``num_appended`` tokens kept (after stop checks)."""
        self.num_generated += num_appended
        if num_drafted == 0:
            return
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_tested += num_accepted + (1 if num_accepted < num_drafted else 0)
        self.num_spec_request_steps += 1
        self.num_spec_generated += num_accepted + 1
        for pos in range(min(num_drafted, self.max_k)):
            self.drafted_at[pos] += 1
            if pos < num_accepted:
                self.accepted_at[pos] += 1

    def record_request_steps(self, num_drafted: int, accepted: list[int],
                             num_appended: int) -> None:
        """:meth:`record_request_step` of each of a drafting flight's verified requests, every
        one with ``num_drafted`` drafts (> 0), ``accepted[i]`` of them accepted; ``num_appended``
        tokens kept in all. The same counts in one call: a flight's commit is on the critical
        path of an overlapped step."""
        n = len(accepted)
        if not n:
            return
        self.num_generated += num_appended
        self.num_drafted += num_drafted * n
        total = sum(accepted)
        self.num_accepted += total
        self.num_tested += total + sum(a < num_drafted for a in accepted)
        self.num_spec_request_steps += n
        self.num_spec_generated += total + n
        # (position p is drafted by every request and accepted by those that accepted > p)
        at = [0] * (num_drafted + 1)
        for a in accepted:
            at[a] += 1
        reached = n
        for pos in range(min(num_drafted, self.max_k)):
            self.drafted_at[pos] += n
            reached -= at[pos]
            self.accepted_at[pos] += reached

    def record_appended(self, num_appended: int) -> None:
        """Requests' steps without drafts (a plain flight's: engine.flight_commit), together:
        ``num_appended`` tokens kept."""
        self.num_generated += num_appended

    def record_step(self, elapsed_s: float, propose_s: float, target_s: float,
                    num_draft_steps: int) -> None:
        """One engine step: total time, proposer time, target forward + verify time, and the
        largest number of drafts proposed for one request (the proposer's sequential steps)."""
        self.num_steps += 1
        self.elapsed_s += elapsed_s
        if num_draft_steps > 0 and target_s > 0:
            ratio = propose_s / num_draft_steps / target_s
            self.draft_cost_ratio += _COST_EMA * (ratio - self.draft_cost_ratio)

    def snapshot(self, baseline_tokens_per_s: float | None = None,
                 prefix_cache_tokens: int = 0) -> EngineMetrics:
        alpha = self.num_accepted / self.num_tested if self.num_tested else 0.0
        mean_k = (self.num_drafted / self.num_spec_request_steps
                  if self.num_spec_request_steps else 0.0)
        tokens_per_s = self.num_generated / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return EngineMetrics(
            num_requests=self.num_requests,
            num_generated=self.num_generated,
            num_drafted=self.num_drafted,
            num_accepted=self.num_accepted,
            num_tested=self.num_tested,
            num_steps=self.num_steps,
            num_spec_request_steps=self.num_spec_request_steps,
            num_preemptions=self.num_preemptions,
            elapsed_s=self.elapsed_s,
            acceptance_rate=self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
            token_acceptance=alpha,
            mean_accepted_length=(self.num_spec_generated / self.num_spec_request_steps
                                  if self.num_spec_request_steps else 0.0),
            acceptance_per_position=[
                a / d if d else 0.0
                for a, d in zip(self.accepted_at, self.drafted_at, strict=True)],
            mean_k=mean_k,
            draft_cost_ratio=self.draft_cost_ratio,
            tokens_per_s=tokens_per_s,
            predicted_speedup=(predicted_speedup(alpha, mean_k, self.draft_cost_ratio)
                               if self.num_spec_request_steps else None),
            measured_speedup=(tokens_per_s / baseline_tokens_per_s
                              if baseline_tokens_per_s and tokens_per_s else None),
            baseline_tokens_per_s=baseline_tokens_per_s,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prefix_cache_tokens=prefix_cache_tokens,
        )
