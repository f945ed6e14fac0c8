"""Prometheus metrics of the server (``GET /metrics``), on a registry of its own.

vLLM's names (``vllm:`` prefix, a ``model_name`` label on each), so that dashboards and alerts
written for vLLM read this server too: ``vllm:num_requests_running`` / ``_waiting`` (gauges),
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``
by ``finished_reason`` (``stop``, ``length``, ``error``, and ``abort`` for a client that went
away), the histograms ``vllm:time_to_first_token_seconds``,
``vllm:time_per_output_token_seconds`` and ``vllm:e2e_request_latency_seconds``, and the
speculation counters ``vllm:spec_decode_num_drafts_total`` (request-steps that verified drafts),
``vllm:spec_decode_num_draft_tokens_total``, ``vllm:spec_decode_num_accepted_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}``, and the prefix cache's
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (context tokens looked up
at admission and found). This engine's own, under
``specdec_``: drafts verified per position, the acceptance rate, goodput (generated tokens per
second over the last window of steps), the queue depth (everything held) and the KV cache tokens
free.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.outputs import RequestOutput
from engine.serving.async_engine import EngineFrontend

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0)
_REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
GOODPUT_WINDOW_S = 10.0
ABORT = "abort"  # vLLM's finished_reason for a request its client abandoned


class ServerMetrics:
    """The metrics, updated from the engine thread (prometheus_client is thread-safe)."""

    def __init__(self, engine: EngineFrontend, max_k: int, model_name: str = "model") -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, [*m, *labels], registry=r)

        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, m, registry=r)

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, text, m, buckets=buckets, registry=r)

        self.requests = counter("vllm:request_success", "Requests finished, by how they ended "
                                "(abort: the client went away)", ("finished_reason",))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Generated tokens of finished requests")
        self.drafts = counter("vllm:spec_decode_num_drafts",
                              "Request-steps that verified drafts")
        self.drafted = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted")
        self.position_accepted = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                         "Draft tokens accepted at each draft position",
                                         ("position",))
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Context tokens looked up in the prefix cache")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Context tokens the prefix cache served")
        self.position_drafted = counter("specdec_spec_draft_tokens_per_pos",
                                        "Draft tokens verified at each draft position",
                                        ("position",))
        self.acceptance_rate = gauge("specdec_spec_acceptance_rate",
                                     "Accepted / drafted tokens since start")
        self.goodput = gauge("specdec_goodput_tokens_per_second",
                             f"Generated tokens per second over the last {GOODPUT_WINDOW_S:g} s")
        self.waiting = gauge("vllm:num_requests_waiting", "Sequences waiting")
        self.running = gauge("vllm:num_requests_running", "Sequences running")
        self.queue_depth = gauge("specdec_queue_depth", "Requests held (waiting or running)")
        self.kv_free = gauge("specdec_kv_cache_free_tokens", "KV cache tokens free")
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              _LATENCY_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Time per output token after the first", _LATENCY_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "From arrival to the last token (or the abort)", _REQUEST_BUCKETS)
        self._name = model_name
        for series in (self.prompt_tokens, self.generation_tokens, self.drafts, self.drafted,
                       self.accepted, self.prefix_queries, self.prefix_hits):
            series.labels(model_name)  # (shown as 0 from the start, not from the first event)
        self._max_k = max_k
        self._seen = (0, 0, 0, [0] * max_k, [0] * max_k)
        self._prefix_seen = (0, 0)
        self._window: deque[tuple[float, int]] = deque()

    def on_step(self) -> None:
        """After every engine step: the engine-wide counters' increments and the gauges."""
        m = self.engine.engine.metrics  # the engine's MetricsCollector (counters since start)
        name = self._name
        drafts, drafted, accepted, per_drafted, per_accepted = self._seen
        self.drafts.labels(name).inc(m.num_spec_request_steps - drafts)
        self.drafted.labels(name).inc(m.num_drafted - drafted)
        self.accepted.labels(name).inc(m.num_accepted - accepted)
        for i in range(self._max_k):
            self.position_drafted.labels(name, str(i)).inc(m.drafted_at[i] - per_drafted[i])
            self.position_accepted.labels(name, str(i)).inc(m.accepted_at[i] - per_accepted[i])
        self._seen = (m.num_spec_request_steps, m.num_drafted, m.num_accepted,
                      list(m.drafted_at), list(m.accepted_at))
        queries, hits = self._prefix_seen
        self.prefix_queries.labels(name).inc(m.prefix_cache_queries - queries)
        self.prefix_hits.labels(name).inc(m.prefix_cache_hits - hits)
        self._prefix_seen = (m.prefix_cache_queries, m.prefix_cache_hits)
        self.acceptance_rate.labels(name).set(
            m.num_accepted / m.num_drafted if m.num_drafted else 0.0)
        self._refresh_gauges()
        now = time.perf_counter()
        self._window.append((now, m.num_generated))
        while self._window and now - self._window[0][0] > GOODPUT_WINDOW_S:
            self._window.popleft()
        first_t, first_n = self._window[0]
        self.goodput.labels(name).set(
            (m.num_generated - first_n) / (now - first_t) if now > first_t else 0.0)

    def on_finish(self, output: RequestOutput, arrival: float, first_token: float | None,
                  finish: float) -> None:
        """A request's last sample finished."""
        name = self._name
        reason = output.outputs[0].finish_reason if output.outputs else None
        self.requests.labels(name, reason or "unknown").inc()
        self.prompt_tokens.labels(name).inc(len(output.prompt_token_ids))
        generated = sum(len(c.token_ids) for c in output.outputs)
        self.generation_tokens.labels(name).inc(generated)
        self.e2e.labels(name).observe(finish - arrival)
        if first_token is not None:
            self.ttft.labels(name).observe(first_token - arrival)
            per_sample = generated / max(len(output.outputs), 1)
            if per_sample > 1:
                self.tpot.labels(name).observe((finish - first_token) / (per_sample - 1))

    def on_abort(self, arrival: float, first_token: float | None, aborted: float) -> None:
        """A request whose client went away, taken out of the engine."""
        self.requests.labels(self._name, ABORT).inc()
        self.e2e.labels(self._name).observe(aborted - arrival)
        if first_token is not None:
            self.ttft.labels(self._name).observe(first_token - arrival)

    def _refresh_gauges(self) -> None:
        stats, name = self.engine.stats, self._name
        self.waiting.labels(name).set(stats.num_waiting)
        self.running.labels(name).set(stats.num_running)
        self.queue_depth.labels(name).set(self.engine.num_pending)
        self.kv_free.labels(name).set(stats.num_free_kv_tokens)

    def render_ready(self) -> None:
        """Before a scrape: the gauges as they are now (also when no step ran since)."""
        self._refresh_gauges()
