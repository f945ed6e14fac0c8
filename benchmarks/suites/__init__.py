"""The suites of ``python -m benchmarks`` (``benchmarks/registry.py`` names them)."""
