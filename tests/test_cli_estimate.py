"""`advisor estimate` end to end: the command is run as a process of its own (`python -m advisor estimate ...`,
forked after its imports: tests/_cli_process.py).

Checked: a good call exits 0; --json prints one JSON object and nothing else on stdout, with figures
that agree with each other; bad input exits 2 with one sentence on stderr that names the file, key or
flag and the value, and never a traceback; a strategy that does not fit exits 1, says so and names
the closest change that fits when there is one; --plan scores a plan file and refuses a malformed one
naming the field.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from _cli_process import run_advisor

from advisor.plan import Plan, plan_to_dict
from advisor.space.strategy import Strategy
from advisor.specs.hardware import PROFILES_DIR, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import MODELS_DIR, load_model

ROOT = Path(__file__).resolve().parents[1]
GPT = ["--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g"]
JSON_KEYS = {"feasible", "reasons", "step_time_s", "tokens_per_s", "tokens_per_s_per_device", "tflops_per_device",
             "hfu_tflops_per_device", "mfu", "memory_gib", "time_s"}
MEMORY_KEYS = {"parameters", "gradients", "optimizer", "activations", "buffers", "total"}


def advisor_estimate(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return run_advisor(["estimate", *args], env, cwd=ROOT, timeout=120)


def assert_no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


def assert_bad_input(r: subprocess.CompletedProcess, *names: str) -> str:
    """Exit 2, no traceback, one line on stderr naming each of `names`; returns that line."""
    assert_no_traceback(r)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"
    return lines[0]


def estimate_json(*args: str) -> dict:
    r = advisor_estimate(*args, "--json")
    assert_no_traceback(r)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)  # the whole of stdout is one JSON document


def model_yaml(tmp_path: Path, name: str = "gpt3-1.3b", filename: str = "model.yaml", **changes) -> Path:
    data = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- good calls ---------------------------------------------------------------------------------
def test_good_call_exits_0_and_prints_the_breakdown():
    r = advisor_estimate(*GPT, "--nodes", "1", "--tp", "2", "--pp", "2", "--gbs", "64", "--mbs", "2")
    assert_no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert "gpt3-1.3b" in r.stdout and "dgx-a100-80g" in r.stdout
    assert "parameters" in r.stdout and "activations" in r.stdout
    assert r.stderr.strip() == ""


@pytest.mark.parametrize("args", [
    GPT + ["--nodes", "1", "--tp", "2", "--pp", "2", "--gbs", "64", "--mbs", "2"],
    ["--model", "megatron-22b", "--hardware", "dgx-a100-80g", "--nodes", "2", "--tp", "8", "--gbs", "64",
     "--sequence-parallel", "--recompute", "selective", "--zero", "1"],
    ["--model", "llama3-8b", "--hardware", "ascend-910", "--nodes", "2", "--tp", "4", "--pp", "2", "--vpp", "2",
     "--gbs", "32", "--recompute", "full", "--seq-len", "4096"],
    ["--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "2", "--pp", "4", "--ep", "8",
     "--gbs", "64", "--seq-len", "4096", "--recompute", "full", "--zero", "1"],
    GPT + ["--devices", "8", "--tp", "2", "--cp", "2", "--gbs", "16", "--schedule", "gpipe", "--pp", "2",
           "--zero", "3", "--attention", "flash", "--framework", "pytorch"],
], ids=["gpt3-tp2-pp2", "megatron-22b-sp", "llama3-8b-ascend-vpp", "mixtral-ep", "gpt3-cp-zero3-gpipe"])
def test_json_output_is_one_object_with_consistent_figures(args):
    r = advisor_estimate(*args, "--json")
    assert_no_traceback(r)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out, dict)
    assert JSON_KEYS <= set(out)
    assert set(out["memory_gib"]) == MEMORY_KEYS
    assert out["feasible"] is True and out["reasons"] == []
    mem = out["memory_gib"]
    parts = sum(mem[k] for k in MEMORY_KEYS - {"total"})
    assert mem["total"] == pytest.approx(parts, rel=1e-6)
    assert mem["total"] >= mem["parameters"] + mem["gradients"] + mem["optimizer"] + mem["activations"]
    assert all(v >= 0 for v in mem.values())
    assert all(isinstance(v, (int, float)) and v >= 0 for v in out["time_s"].values())
    gbs, seq, devices = out["global_batch_size"], out["seq_length"], out["devices"]
    assert out["step_time_s"] > 0
    assert out["tokens_per_s"] == pytest.approx(gbs * seq / out["step_time_s"], rel=1e-9)
    assert out["tokens_per_s_per_device"] == pytest.approx(out["tokens_per_s"] / devices, rel=1e-9)
    assert sum(out["time_s"].values()) == pytest.approx(out["step_time_s"], rel=1e-9)
    assert 0 < out["mfu"] <= out["hfu"] <= 1
    assert out["hfu_tflops_per_device"] >= out["tflops_per_device"] > 0


def test_json_reports_the_strategy_given_by_flags():
    out = estimate_json(*GPT, "--nodes", "1", "--tp", "2", "--pp", "2", "--gbs", "64", "--mbs", "2", "--zero", "1",
                        "--recompute", "selective", "--sequence-parallel")
    s = out["strategy"]
    assert (s["dp"], s["tp"], s["pp"], s["cp"]) == (2, 2, 2, 1)
    assert (s["micro_batch_size"], s["num_micro_batches"]) == (2, 16)
    assert s["zero_stage"] == 1 and s["recompute"] == "selective" and s["sequence_parallel"] is True
    assert out["devices"] == 8 and out["global_batch_size"] == 64 and out["seq_length"] == 2048
    assert out["model"] == "gpt3-1.3b" and out["hardware"] == "dgx-a100-80g" and out["dtype"] == "bf16"


def test_json_time_to_train_follows_the_token_budget():
    out = estimate_json(*GPT, "--devices", "8", "--tp", "2", "--pp", "2", "--gbs", "64", "--tokens", "300B")
    assert out["time_to_train_s"] == pytest.approx(300e9 / out["tokens_per_s"], rel=1e-9)
    hours = out["time_to_train_s"] / 3600 * 8
    assert out["cost_to_train_usd"] == pytest.approx(hours * load_hardware("dgx-a100-80g").price_per_device_hour_usd, rel=1e-9)


def test_model_and_hardware_given_as_paths(tmp_path):
    hw = tmp_path / "hw.yaml"
    hw.write_text((PROFILES_DIR / "dgx-a100-80g.yaml").read_text())
    by_path = estimate_json("--model", str(model_yaml(tmp_path)), "--hardware", str(hw), "--nodes", "1", "--gbs", "64")
    by_name = estimate_json(*GPT, "--nodes", "1", "--gbs", "64")
    assert by_path["step_time_s"] == pytest.approx(by_name["step_time_s"], rel=1e-12)
    assert by_path["memory_gib"] == pytest.approx(by_name["memory_gib"], rel=1e-12)


# ---- bad input: exit 2, one sentence naming the culprit ----------------------------------------
def test_unknown_model_name():
    line = assert_bad_input(advisor_estimate("--model", "gpt5-huge", "--hardware", "dgx-a100-80g", "--nodes", "1"),
                            "gpt5-huge")
    assert "gpt3-1.3b" in line  # lists what is bundled


def test_unknown_hardware_name():
    assert_bad_input(advisor_estimate("--model", "gpt3-1.3b", "--hardware", "tpu-v9", "--nodes", "1"), "tpu-v9")


def test_missing_model_file():
    assert_bad_input(advisor_estimate("--model", "/nonexistent/model.yaml", "--hardware", "dgx-a100-80g", "--nodes", "1"),
                     "/nonexistent/model.yaml")


def test_malformed_model_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nnum_layers: [1, 2\n")
    line = assert_bad_input(advisor_estimate("--model", str(path), "--hardware", "dgx-a100-80g", "--nodes", "1"), str(path))
    assert "YAML" in line


@pytest.mark.parametrize("changes, names", [
    ({"flash_layers": 3}, ["unknown key", "flash_layers", "3"]),
    ({"vocab_size": None}, ["missing", "vocab_size"]),
    ({"num_layers": 0}, ["num_layers", "0", "positive"]),
    ({"hidden_size": -2048}, ["hidden_size", "-2048"]),
    ({"num_layers": 2.5}, ["num_layers", "2.5", "integer"]),
    ({"vocab_size": "lots"}, ["vocab_size", "lots"]),
    ({"num_attention_heads": 15}, ["num_attention_heads", "15", "hidden_size", "2048"]),
    ({"num_kv_heads": 3}, ["num_kv_heads", "3", "16"]),
    ({"ffn_activation": "relu"}, ["ffn_activation", "relu"]),
], ids=["unknown-key", "missing-key", "zero-size", "negative-size", "non-integer-size", "string-size",
        "heads-not-dividing-hidden", "kv-heads-not-dividing-heads", "bad-activation"])
def test_invalid_model_yaml(tmp_path, changes, names):
    path = model_yaml(tmp_path, **changes)
    assert_bad_input(advisor_estimate("--model", str(path), "--hardware", "dgx-a100-80g", "--nodes", "1"), str(path), *names)


def test_hardware_file_with_negative_bandwidth(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "dgx-a100-80g.yaml").read_text())
    data["inter_node"]["bandwidth_gbps"] = -25
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert_bad_input(advisor_estimate("--model", "gpt3-1.3b", "--hardware", str(path), "--nodes", "1"),
                     str(path), "inter_node", "bandwidth_gbps", "-25")


def test_hardware_file_with_negative_intra_node_bandwidth(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "ascend-910.yaml").read_text())
    data["node"]["intra_node"]["cross_group_bandwidth_gbps"] = -32
    path = tmp_path / "ascend.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert_bad_input(advisor_estimate("--model", "gpt3-1.3b", "--hardware", str(path), "--nodes", "1"),
                     str(path), "cross_group_bandwidth_gbps", "-32")


def test_degrees_not_multiplying_to_the_device_count():
    line = assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--dp", "2", "--tp", "2", "--pp", "1", "--gbs", "64"),
                            "devices", "8")
    assert "2 x 2 x 1 x 1 = 4" in line


def test_tp_x_pp_not_dividing_the_device_count():
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--tp", "3"), "--tp 3", "8 devices")


def test_explicit_dp_not_matching_the_devices_names_the_device_count():
    line = assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--dp", "3"), "3")
    assert "devices" in line and "--gbs" not in line


@pytest.mark.parametrize("args, names", [
    (["--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2", "--tp", "16"], ["tp = 16", "kv heads = 8"]),
    (GPT + ["--devices", "3", "--tp", "3", "--gbs", "3"], ["tp = 3", "heads = 16"]),
], ids=["tp-16-kv-heads-8", "tp-3-heads-16"])
def test_tp_not_dividing_heads(args, names):
    line = assert_bad_input(advisor_estimate(*args), *names)
    assert "heads" in line


def test_global_batch_not_divisible_by_dp_x_mbs():
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--gbs", "12", "--mbs", "1"), "--gbs 12", "8 x 1")
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--gbs", "64", "--mbs", "3"), "--gbs 64", "8 x 3")


@pytest.mark.parametrize("args, names", [
    (["--recompute", "half"], ["--recompute", "half"]),
    (["--schedule", "zigzag"], ["--schedule", "zigzag"]),
    (["--zero", "5"], ["--zero", "5"]),
    (["--zero", "-1"], ["--zero", "-1"]),
    (["--tp", "0"], ["--tp", "0"]),
    (["--mbs", "0"], ["--mbs", "0"]),
    (["--attention", "fast"], ["--attention", "fast"]),
    (["--dtype", "int4"], ["--dtype", "int4"]),
    (["--tokens", "lots"], ["--tokens", "lots"]),
    (["--seq-len", "0"], ["--seq-len", "0"]),
    (["--gbs", "0"], ["0"]),
    (["--ep", "2"], ["ep = 2", "dense model"]),
    (["--pp", "2", "--vpp", "5", "--gbs", "64", "--framework", "pytorch"], ["vpp = 5", "stage_layers"]),  # Megatron's layout runs it
    (["--cp", "8", "--seq-len", "2004"], ["cp = 8", "seq = 2004"]),
], ids=["recompute", "schedule", "zero-5", "zero-negative", "tp-0", "mbs-0", "attention", "dtype", "tokens",
        "seq-len-0", "gbs-0", "ep-on-dense", "vpp-not-dividing-stages", "cp-not-dividing-seq"])
def test_bad_flag_values(args, names):
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", *args), *names)


def test_dtype_the_device_does_not_have():
    assert_bad_input(advisor_estimate("--model", "gpt3-1.3b", "--hardware", "ascend-910", "--nodes", "1", "--dtype", "bf16"),
                     "--dtype bf16", "ascend-910", "fp16")


def test_cluster_size_missing_or_doubled():
    assert_bad_input(advisor_estimate(*GPT), "--nodes", "--devices")
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", "--devices", "8"), "--nodes", "--devices")
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "0"), "--nodes", "0")


@pytest.mark.parametrize("args", [["--bogus", "3"], ["--zero", "abc"]], ids=["unknown-flag", "non-integer-zero"])
def test_usage_errors_exit_2_naming_the_flag(args):
    r = advisor_estimate(*GPT, "--nodes", "1", *args)
    assert_no_traceback(r)
    assert r.returncode == 2, r.stderr
    assert args[0] in r.stderr and r.stdout == ""


@pytest.mark.parametrize("args, names", [
    (["--bogus", "3"], ["--bogus"]),
    (["--zero", "abc"], ["--zero", "abc"]),
], ids=["unknown-flag", "non-integer-zero"])
def test_usage_errors_are_one_sentence_naming_flag_and_value(args, names):
    assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", *args), *names)


@pytest.mark.parametrize("args, names", [
    (["--sequence-parallel"], ["tp = 1"]),
    (["--offload-optimizer"], ["zero = 0"]),
], ids=["sp-with-tp-1", "offload-with-zero-0"])
def test_rule_messages_name_the_value(args, names):
    line = assert_bad_input(advisor_estimate(*GPT, "--nodes", "1", *args), *names)
    assert "()" not in line


def test_rule_messages_without_detail_still_exit_2():
    for args in (["--sequence-parallel"], ["--offload-optimizer"]):
        r = advisor_estimate(*GPT, "--nodes", "1", *args)
        assert_no_traceback(r)
        assert r.returncode == 2 and "illegal strategy" in r.stderr


# ---- infeasible: exit 1 ------------------------------------------------------------------------
def test_out_of_memory_exits_1_and_names_the_closest_change_that_fits():
    r = advisor_estimate("--model", "gpt3-13b", "--hardware", "dgx-a100-80g", "--nodes", "1", "--tp", "2", "--gbs", "64")
    assert_no_traceback(r)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert "does not fit" in lines[0] and "80 GiB" in lines[0]
    assert "closest change that fits: --zero 1" in lines[0]


def test_out_of_memory_on_ascend_names_a_fitting_change():
    r = advisor_estimate("--model", "gpt3-1.3b", "--hardware", "ascend-910", "--nodes", "1", "--gbs", "64", "--mbs", "8")
    assert_no_traceback(r)
    assert r.returncode == 1
    assert "does not fit" in r.stderr and "32 GiB" in r.stderr
    assert "closest change that fits: --" in r.stderr


def test_out_of_memory_without_any_single_fitting_change_names_the_closest_pair():
    # no single change fits (issue 12: the closest change is then named even when two are needed)
    r = advisor_estimate("--model", "megatron-22b", "--hardware", "dgx-a100-80g", "--nodes", "1", "--gbs", "64", "--mbs", "8")
    assert_no_traceback(r)
    assert r.returncode == 1
    assert "does not fit" in r.stderr and "closest change that fits: --zero 3 --recompute full (" in r.stderr


def test_out_of_memory_with_json_still_prints_the_object():
    r = advisor_estimate("--model", "gpt3-13b", "--hardware", "dgx-a100-80g", "--nodes", "1", "--tp", "2", "--gbs", "64",
                         "--json")
    assert_no_traceback(r)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["feasible"] is False and out["reasons"]
    assert out["memory_gib"]["total"] > 80
    assert out["closest_fit"].startswith("--zero 1")
    assert "does not fit" in r.stderr


# ---- --plan ------------------------------------------------------------------------------------
def _plan_dict() -> dict:
    model, hw = load_model("gpt3-1.3b"), load_hardware("dgx-a100-80g")
    plan = Plan(model=model, hardware=hw, cluster=Cluster.of(hw, nodes=1),
                training=TrainingJob(global_batch_size=64, seq_length=2048),
                strategy=Strategy(dp=2, tp=2, pp=2, micro_batch_size=2, num_micro_batches=16, zero_stage=1))
    return plan_to_dict(plan)


def _write_plan(tmp_path: Path, data) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_plan_file_is_scored_like_the_same_flags(tmp_path):
    path = _write_plan(tmp_path, _plan_dict())
    r = advisor_estimate("--plan", str(path), "--json")
    assert_no_traceback(r)
    assert r.returncode == 0, r.stderr
    from_plan = json.loads(r.stdout)
    from_flags = estimate_json(*GPT, "--nodes", "1", "--tp", "2", "--pp", "2", "--gbs", "64", "--mbs", "2", "--zero", "1")
    assert from_plan["step_time_s"] == pytest.approx(from_flags["step_time_s"], rel=1e-12)
    assert from_plan["memory_gib"] == pytest.approx(from_flags["memory_gib"], rel=1e-12)


def _set(data: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


BAD_PLAN_FIELDS = [
    ("parallel.tp", "two", ["parallel", "tp", "two"]),
    ("parallel.dp", 0, ["parallel", "dp", "0"]),
    ("parallel.recompute", "sometimes", ["recompute", "sometimes"]),
    ("parallel.pipeline_schedule", "zigzag", ["pipeline_schedule", "zigzag"]),
    ("parallel.stage_layers", [20, 5], ["stage_layers"]),
    ("parallel.mesh_order", ["tp", "dp"], ["mesh_order"]),
    ("parallel.warp_speed", 9, ["parallel", "warp_speed"]),
    ("training.seq_length", _DELETE, ["training", "seq_length"]),
    ("training.dtype", "bf17", ["training", "dtype", "bf17"]),
    ("cluster.devices", 1000, ["cluster", "devices", "1000"]),
    ("model.num_layers", -1, ["model", "num_layers", "-1"]),
    ("hardware.inter_node.bandwidth_gbps", -25, ["hardware", "inter_node", "bandwidth_gbps", "-25"]),
    ("schema_version", 7, ["schema_version", "7"]),
    ("parallel", _DELETE, ["parallel"]),
]


@pytest.mark.parametrize("field, value, names", BAD_PLAN_FIELDS, ids=[f"{f}={'(deleted)' if v is _DELETE else v}" for f, v, _ in BAD_PLAN_FIELDS])
def test_malformed_plan_names_the_field(tmp_path, field, value, names):
    path = _write_plan(tmp_path, _set(_plan_dict(), field, value))
    assert_bad_input(advisor_estimate("--plan", str(path)), str(path), *names)


def test_plan_that_is_not_json(tmp_path):
    path = _write_plan(tmp_path, '{"schema_version": 1, "model": ')
    line = assert_bad_input(advisor_estimate("--plan", str(path)), str(path))
    assert "JSON" in line


def test_plan_that_is_not_an_object(tmp_path):
    assert_bad_input(advisor_estimate("--plan", str(_write_plan(tmp_path, [1, 2, 3]))), "plan.json")


def test_plan_file_not_found():
    assert_bad_input(advisor_estimate("--plan", "/nonexistent/plan.json"), "/nonexistent/plan.json")


def test_context_parallelism_with_the_unfused_attention_is_refused():
    """No framework advisor exports runs ring attention on the unfused softmax(QK^T)V (Megatron-Core's local
    attention asserts cp == 1; torch's context_parallel runs on SDPA's fused kernels)."""
    r = advisor_estimate(*GPT, "--devices", "8", "--tp", "2", "--cp", "2", "--gbs", "16", "--pp", "2",
                         "--attention", "math", "--framework", "pytorch")
    assert r.returncode == 2
    assert "does not run context parallelism on this attention" in r.stderr
    assert "on the fused attention kernels sdpa only (give --attention flash)" in r.stderr


def test_context_parallelism_on_a_kernel_without_a_ring_is_refused():
    """llm-foundry's attn_impl "triton" calls flash-attn 1.x's Triton kernel, which torch's context_parallel (a
    ring in place of the SDPA operators) does not reach: a PyTorch plan with cp > 1 on it cannot run as priced."""
    r = advisor_estimate(*GPT, "--devices", "8", "--tp", "2", "--cp", "2", "--gbs", "16", "--pp", "2",
                         "--attention-kernel", "triton", "--framework", "pytorch")
    assert r.returncode == 2
    assert "does not run context parallelism on this attention" in r.stderr
    assert "attention kernel = triton" in r.stderr
    ok = advisor_estimate(*GPT, "--devices", "8", "--tp", "2", "--cp", "2", "--gbs", "16", "--pp", "2",
                          "--attention-kernel", "sdpa", "--framework", "pytorch")
    assert ok.returncode == 0, ok.stderr
