"""The benchmarks: one entry, ``python -m benchmarks <suite> [options]``, one result record.

``python -m benchmarks --list`` names the suites (``benchmarks/registry.py``); each prints its
numbers and, with ``--json PATH``, writes one :class:`benchmarks.record.Record`. Shared parts:
``workloads`` (prompts), ``models`` (targets of real shape), ``timing`` (synchronisation, systems
taking turns, the machine's contention), ``engines`` (engine and Hugging Face runs), ``oracle``
(drafts of a set acceptance). A benchmark prints numbers; it never asserts on time.
"""
