"""Cells every notebook starts with."""

SETUP = '''
import os

import _repo_path  # noqa: F401  (puts the repository root on sys.path: runs from a checkout)
import torch
from speedup_lib import machine_description
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # (no "Loading weights" bar in the outputs)

# SPECDEC_QUICK=1: a smoke run with fewer tokens, prompts and settings (what CI executes).
QUICK = os.environ.get("SPECDEC_QUICK") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
print("quick mode" if QUICK else "full mode", "on", machine_description())
'''

MACHINE_NOTE = '''
The outputs committed with this notebook were produced in full mode on a shared CPU-only machine
(2 cores, other jobs running at the same time: absolute times are slow and noisy; the first code
cell prints the machine). On a GPU the notebook runs the same code on `cuda`. Set
`SPECDEC_QUICK=1` for a fast smoke run with fewer tokens and settings.
'''
