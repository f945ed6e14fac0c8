"""The sampler registry lists the built-in names without importing them (no torch), and the
built-in modules register exactly the names the registry lists for them."""

import importlib
import subprocess
import sys

from samplers import registry


def test_the_builtin_table_matches_what_the_modules_register():
    for module in set(registry.BUILTIN_SAMPLERS.values()):
        importlib.import_module(module)
    registered = {name: cls.__module__ for name, cls in registry._SAMPLERS.items()
                  if cls.__module__.startswith("samplers.")}
    assert registered == registry.BUILTIN_SAMPLERS


def test_listing_and_a_lookup_of_the_names():
    code = ("import sys\nimport samplers\nnames = samplers.available_samplers()\n"
            "assert 'torch' not in sys.modules, 'listing imported torch'\n"
            "assert samplers.get_sampler('greedy').__class__.__name__ == 'GreedySampler'\n"
            "print(names)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(registry.BUILTIN_SAMPLERS))
