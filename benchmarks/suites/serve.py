"""The server: open-loop Poisson arrivals with and without speculation (``arrivals``), and its
time per output token over ``LLM.generate_stream`` at the same batch (``overhead``)."""

from __future__ import annotations

from benchmarks.registry import Case
from benchmarks.suites import serve_arrivals, serve_overhead

CASES = {
    "arrivals": Case("Poisson arrivals at several rates, n-gram against no speculation",
                     serve_arrivals.add_arguments, serve_arrivals.run),
    "overhead": Case("the server's TPOT against LLM.generate_stream at the same batch",
                     serve_overhead.add_arguments, serve_overhead.run),
}
