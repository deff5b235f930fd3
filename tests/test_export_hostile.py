"""Hostile names in a plan cannot become code in any export (issue 12, "Injection through names").

A plan JSON can be written by hand, so every string of it that reaches an export is escaped for the
target's syntax. Each target is exported twice, with benign names and with names full of newlines,
quotes, command substitutions, TOML/YAML/Python terminators and Unicode line breaks, and every file
is parsed with the target's own grammar: ``bash -n`` and the same commands (lines outside comments)
as the benign export; ``ast.parse`` with the same statements; ``tomllib`` with the same tables and
keys; ``yaml.safe_load_all`` with exactly one document, equal to the benign one apart from the names.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import tomllib
from dataclasses import replace

import pytest
import yaml

from _export_plans import plans
from advisor.export import TARGETS, export_plan

HOSTILE = ('x"\n$(touch /tmp/pwned)`id`\'\r\n"""\n]]\n[job]\n---\nkind: Pod\nmetadata: {name: evil}\n'
           "\x00\x1b[2J\u2028\u2029\x85 end")
# the Megatron-based targets take every degree the plan has; the others are checked on plans they accept
PLANS = ("gpt3_gpipe_fp16", "mixtral_ep_vpp", "llama8b_cp_zero3_offload")


def _named(plan, name: str):
    hw = plan.hardware
    return replace(plan, model=replace(plan.model, name=name),
                   hardware=replace(hw, name=name, device=replace(hw.device, name=name)))


def _code_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _check_file(name: str, benign: str, hostile: str) -> None:
    assert "\x00" not in hostile and "\r" not in hostile and "\u2028" not in hostile, name
    assert len(hostile.splitlines()) == len(benign.splitlines()), name
    if name.endswith(".sh"):
        if shutil.which("bash"):
            proc = subprocess.run(["bash", "-n"], input=hostile, capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, (name, proc.stderr)
        # the names live in comments only: the commands are the benign export's, line for line
        assert _code_lines(hostile) == _code_lines(benign), name
    elif name.endswith(".py"):
        a, b = ast.parse(benign), ast.parse(hostile)
        assert ast.dump(a) == ast.dump(b), name
    elif name.endswith(".toml"):
        assert tomllib.loads(hostile) == tomllib.loads(benign), name
    elif name.endswith((".yaml", ".yml")):
        docs, ref = list(yaml.safe_load_all(hostile)), list(yaml.safe_load_all(benign))
        assert len(docs) == len(ref) == 1, name
        assert all(d.get("kind") != "Pod" for d in docs), name
        if name != "pytorchjob.yaml":
            assert docs == ref, name
        else:   # the job's name is derived from the names, RFC 1123-clean
            meta = docs[0]["metadata"]["name"]
            assert meta and all(c.isalnum() or c == "-" for c in meta) and len(meta) <= 63
            docs[0]["metadata"]["name"] = ref[0]["metadata"]["name"]
            assert docs == ref, name
    elif name.endswith(".json"):
        assert json.loads(hostile) == json.loads(benign), name
    else:
        assert _code_lines(hostile) == _code_lines(benign), name


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_names_stay_data(target):
    for plan_name in PLANS:
        plan = plans()[plan_name]
        if target == "deepspeed" and plan.strategy.cp > 1 and plan.strategy.pp > 1:
            continue
        benign = export_plan(_named(plan, "benign-name"), target)
        hostile = export_plan(_named(plan, HOSTILE), target)
        assert list(benign.files) == list(hostile.files)
        for name in hostile.files:
            _check_file(name, benign.files[name], hostile.files[name])
        # sentences are printed by the CLI through advisor.export._common.display (test_display_...)


def test_display_keeps_one_line():
    from advisor.export._common import comment_block, display

    shown = display(HOSTILE)
    assert shown.isprintable() and "\\n" in shown and "\\x1b" in shown and "\\u2028" in shown
    assert display(shown) == shown
    assert comment_block([HOSTILE]).count("\n") == 1 and len(comment_block([HOSTILE]).splitlines()) == 1
