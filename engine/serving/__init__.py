"""The OpenAI-compatible server (`python -m engine.serve`): an asynchronous engine loop, the
HTTP routes and their request/response shapes, and Prometheus metrics."""
