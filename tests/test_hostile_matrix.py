"""#33: the generated hostile cases of benchmarks/hostile.py (every input file and flag), every eighth of them: each
ends with exit 0, 1 or 2 and no traceback. (The benchmark runs them all and also times each.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "hostile.py"


def _hostile():
    spec = importlib.util.spec_from_file_location("hostile_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_eighth_hostile_case_ends_in_one_sentence(tmp_path):
    hostile = _hostile()
    todo = hostile.cases(tmp_path)[::8]
    assert len(todo) > 250
    bad = []
    for label, argv in todo:
        code, err, _ = hostile.run(argv)
        if not hostile.clean(code, err, 0.0):
            bad.append(f"{label}: exit {code}: {err.strip()[-300:]}")
    assert not bad, "\n".join(bad)
