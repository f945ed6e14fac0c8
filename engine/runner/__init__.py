"""The model side: loading (:mod:`engine.runner.loader`), the batched forward over a paged KV
cache with rollback (:mod:`engine.runner.model_runner`, :mod:`engine.runner.kv_cache`), CUDA
graphs, the attention backend and CPU GEMM packing. It decides nothing about what runs."""
