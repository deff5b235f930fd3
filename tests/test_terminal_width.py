"""#33: every command's output fits an 80-column terminal: no line wider, no cell cut short with an ellipsis.

Each command runs as a user's shell runs it, on a terminal 80 columns wide (rich takes TTY_COMPATIBLE=1 and
COLUMNS=80 as one), and its standard output is measured in characters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COMMANDS = {
    "recommend": ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"],
    "recommend recommendation model": ["recommend", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g",
                                       "--nodes", "1", "--ps-async"],
    "recommend mixed cluster": ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1"],
    "recommend supernet": ["recommend", "--model", "hat-supernet", "--hardware", "dgx-a100-80g", "--devices", "4",
                           "--global-batch", "32"],
    "estimate": ["estimate", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "4", "--tp", "4", "--pp", "4",
                 "--zero", "1", "--recompute", "full"],
    "estimate recommendation model": ["estimate", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g",
                                      "--nodes", "1", "--ps-mode", "hybrid"],
    "estimate mixed cluster": ["estimate", "--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1",
                               "--tp", "2", "--pp", "2"],
    "whatif": ["whatif", "--model", "llama3-8b", "--hardware", "dgx-h100,dgx-a100-80g", "--nodes", "1,2"],
    "list models": ["list", "models"],
    "list hardware": ["list", "hardware"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_output_fits_80_columns(name):
    env = {**os.environ, "COLUMNS": "80", "LINES": "50", "TTY_COMPATIBLE": "1", "NO_COLOR": "1",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "advisor", *COMMANDS[name]], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ANSI.sub("", line).rstrip() for line in proc.stdout.splitlines()]
    assert len(lines) > 3
    wide = [line for line in lines if len(line) > 80]
    cut = [line for line in lines if "…" in line]
    assert not wide and not cut, "\n".join(wide + cut)
