"""Prometheus metrics of the server (``GET /metrics``), on a registry of its own.

Counters: requests by outcome, prompt and generated tokens, drafted and accepted tokens (overall
and per draft position), prefix-cache queries and hits (context tokens looked up at admission
and found, vLLM's pair). Gauges: requests waiting and running, queue depth (everything held),
KV cache tokens free, acceptance rate, goodput (generated tokens per second over the last
window of steps). Histograms: time to first token and time per output token, per request.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.outputs import RequestOutput
from engine.serving.async_engine import EngineFrontend

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0)
GOODPUT_WINDOW_S = 10.0


class ServerMetrics:
    """The metrics, updated from the engine thread (prometheus_client is thread-safe)."""

    def __init__(self, engine: EngineFrontend, max_k: int) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec_requests", "Requests by how they ended",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter("specdec_generation_tokens", "Generated tokens",
                                         registry=r)
        self.drafted = Counter("specdec_spec_draft_tokens", "Draft tokens verified", registry=r)
        self.accepted = Counter("specdec_spec_accepted_tokens", "Draft tokens accepted",
                                registry=r)
        self.position_drafted = Counter("specdec_spec_draft_tokens_per_position",
                                        "Draft tokens verified at each draft position",
                                        ["position"], registry=r)
        self.position_accepted = Counter("specdec_spec_accepted_tokens_per_position",
                                         "Draft tokens accepted at each draft position",
                                         ["position"], registry=r)
        self.prefix_queries = Counter("specdec_prefix_cache_queries",
                                      "Context tokens looked up in the prefix cache", registry=r)
        self.prefix_hits = Counter("specdec_prefix_cache_hits",
                                   "Context tokens the prefix cache served", registry=r)
        self.acceptance_rate = Gauge("specdec_spec_acceptance_rate",
                                     "Accepted / drafted tokens since start", registry=r)
        self.goodput = Gauge("specdec_goodput_tokens_per_second",
                             f"Generated tokens per second over the last {GOODPUT_WINDOW_S:g} s",
                             registry=r)
        self.waiting = Gauge("specdec_requests_waiting", "Sequences waiting", registry=r)
        self.running = Gauge("specdec_requests_running", "Sequences running", registry=r)
        self.queue_depth = Gauge("specdec_queue_depth", "Requests held (waiting or running)",
                                 registry=r)
        self.kv_free = Gauge("specdec_kv_cache_free_tokens", "KV cache tokens free", registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("specdec_time_per_output_token_seconds",
                              "Time per output token after the first", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self._max_k = max_k
        self._seen = (0, 0, [0] * max_k, [0] * max_k)
        self._prefix_seen = (0, 0)
        self._window: deque[tuple[float, int]] = deque()

    def on_step(self) -> None:
        """After every engine step: the engine-wide counters' increments and the gauges."""
        m = self.engine.engine.metrics  # the engine's MetricsCollector (counters since start)
        drafted, accepted, per_drafted, per_accepted = self._seen
        self.drafted.inc(m.num_drafted - drafted)
        self.accepted.inc(m.num_accepted - accepted)
        for i in range(self._max_k):
            self.position_drafted.labels(str(i)).inc(m.drafted_at[i] - per_drafted[i])
            self.position_accepted.labels(str(i)).inc(m.accepted_at[i] - per_accepted[i])
        self._seen = (m.num_drafted, m.num_accepted, list(m.drafted_at), list(m.accepted_at))
        queries, hits = self._prefix_seen
        self.prefix_queries.inc(m.prefix_cache_queries - queries)
        self.prefix_hits.inc(m.prefix_cache_hits - hits)
        self._prefix_seen = (m.prefix_cache_queries, m.prefix_cache_hits)
        self.acceptance_rate.set(m.num_accepted / m.num_drafted if m.num_drafted else 0.0)
        self._refresh_gauges()
        now = time.perf_counter()
        self._window.append((now, m.num_generated))
        while self._window and now - self._window[0][0] > GOODPUT_WINDOW_S:
            self._window.popleft()
        first_t, first_n = self._window[0]
        self.goodput.set((m.num_generated - first_n) / (now - first_t) if now > first_t else 0.0)

    def on_finish(self, output: RequestOutput, arrival: float, first_token: float | None,
                  finish: float) -> None:
        """A request's last sample finished."""
        reason = output.outputs[0].finish_reason if output.outputs else None
        self.requests.labels(reason or "unknown").inc()
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        generated = sum(len(c.token_ids) for c in output.outputs)
        self.generation_tokens.inc(generated)
        if first_token is not None:
            self.ttft.observe(first_token - arrival)
            per_sample = generated / max(len(output.outputs), 1)
            if per_sample > 1:
                self.tpot.observe((finish - first_token) / (per_sample - 1))

    def _refresh_gauges(self) -> None:
        stats = self.engine.stats
        self.waiting.set(stats.num_waiting)
        self.running.set(stats.num_running)
        self.queue_depth.set(self.engine.num_pending)
        self.kv_free.set(stats.num_free_kv_tokens)

    def render_ready(self) -> None:
        """Before a scrape: the gauges as they are now (also when no step ran since)."""
        self._refresh_gauges()
