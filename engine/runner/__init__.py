"""The model side: loading (:mod:`engine.runner.loader`), the batched forward over a paged KV
cache with rollback (:mod:`engine.runner.model_runner`, a front over slot bookkeeping, the step
layout, and the executor; :mod:`engine.runner.kv_cache`), CUDA graphs, the attention backend and
CPU GEMM packing. A forward returns a :class:`ForwardOutput`. It decides nothing about what runs."""

from engine.runner.forward_output import FedChains, FedTokens, ForwardOutput

__all__ = ["FedChains", "FedTokens", "ForwardOutput"]
