"""The proposer registry lists the built-in names without importing them (no torch), and the
built-in modules register exactly the names the registry lists for them."""

import importlib
import subprocess
import sys

from proposers import registry


def test_the_builtin_table_matches_what_the_modules_register():
    for module in set(registry.BUILTIN_PROPOSERS.values()):
        importlib.import_module(module)
    registered = {name: factory.__module__ for name, factory in registry._FACTORIES.items()
                  if factory.__module__.startswith("proposers.")}
    assert registered == registry.BUILTIN_PROPOSERS


def test_listing_and_a_lookup_of_the_names():
    code = ("import sys\nimport proposers\nnames = proposers.available_proposers()\n"
            "assert 'torch' not in sys.modules, 'listing imported torch'\n"
            "assert proposers.proposer_needs_kv_cache('early_exit')\n"
            "assert not proposers.proposer_needs_kv_cache('ngram')\n"
            "print(names)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(registry.BUILTIN_PROPOSERS))
