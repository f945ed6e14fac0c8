"""Across GPUs: a random checkpoint of a real shape (``save``), one layout's tokens/s (``run``:
one GPU, layers over GPUs, tensor parallel under torchrun), the layouts against one GPU
(``table``), one small all-reduce's latency (``allreduce``, under torchrun), and the two-GPU
session that runs them all (``session``)::

    python -m benchmarks parallel save --model random-llama-8b --dir /tmp/llama8b
    python -m benchmarks parallel run --layout single --model /tmp/llama8b --json single.json
    torchrun --nproc-per-node 2 -m benchmarks parallel run --layout tp --methods none \\
        --model /tmp/llama8b --json tp-none.json
    python -m benchmarks parallel table single.json tp-none.json
"""

from __future__ import annotations

from benchmarks.registry import Case
from benchmarks.suites import allreduce, parallel_layouts, parallel_session, parallel_table

CASES = {
    "save": Case("write a decisive random-weight checkpoint of a real shape",
                 parallel_layouts.add_save_arguments, parallel_layouts.run_save),
    "run": Case("tokens/s of one layout (single, pipeline, tp), with and without n-gram",
                parallel_layouts.add_run_arguments, parallel_layouts.run_layout),
    "table": Case("measured layouts against one GPU, outputs compared",
                  parallel_table.add_arguments, parallel_table.run),
    "allreduce": Case("one small all-reduce: NCCL against symmetric memory (torchrun)",
                      allreduce.add_arguments, allreduce.run),
    "session": Case("the two-GPU session: tests, every layout, the table",
                    parallel_session.add_arguments, parallel_session.run),
}
