"""--target-version, the launch route of the DeepSpeed export, MindFormers' MoE section, and the notes
printed in text mode (issue 12, "Exports that the real targets accept")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _export_plans import REFUSED, make_plan, plans
from _release_parse import MPU
from advisor.errors import AdvisorError
from advisor.export import TARGETS, export_plan, supported_versions
from advisor.plan import save_plan

ROOT = Path(__file__).resolve().parents[1]


def test_every_target_names_its_versions_and_refuses_others():
    plan = plans()["llama8b_dp_drec"]
    for target in TARGETS:
        versions, default = supported_versions(target)
        assert default in versions
        for version in versions:
            export_plan(plan, target, version)
        with pytest.raises(AdvisorError, match=f"supports {versions[0]}") as err:
            export_plan(plan, target, "9.9")
        assert "--target-version" in str(err.value) and default in str(err.value)


def test_megatron_zero3_needs_megatron_fsdp():
    plan = plans()["llama8b_cp_zero3_offload"]
    with pytest.raises(AdvisorError, match="parallel.zero_stage = 3.*0.14 or 0.15"):
        export_plan(plan, "megatron", "0.13")
    script = export_plan(plan, "megatron", "0.14").files["megatron_pretrain_gpt.sh"]
    assert "--use-megatron-fsdp" in script and "Megatron-Core 0.14, tag core_v0.14.0" in script
    # ZeRO-1 still exports for 0.13
    assert "--use-distributed-optimizer" in export_plan(plans()["llama8b_dp_drec"], "megatron", "0.13").text()


def test_k8s_image_and_code_follow_the_version():
    doc = yaml.safe_load(export_plan(plans()["llama70b_uneven_pp"], "k8s", "0.14").files["pytorchjob.yaml"])
    pod = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["git", "clone"] and "core_v0.14.0" in init["command"]
    (container,) = pod["containers"]
    assert container["image"] == "nvcr.io/nvidia/pytorch:25.04-py3"
    script = container["command"][container["command"].index("--nproc-per-node") + 2]
    assert script == init["command"][-1] + "/pretrain_gpt.py"
    assert "nvidia.com/gpu" in container["resources"]["limits"]


def test_k8s_ascend_plans_ask_for_ascend_devices_and_say_the_image_does_not_fit():
    result = export_plan(plans()["gpt3_gpipe_fp16"], "k8s")
    container = yaml.safe_load(result.files["pytorchjob.yaml"])["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "spec"]["containers"][0]
    assert container["resources"]["limits"] == {"huawei.com/Ascend910": "8"}
    assert any("does not run on this device" in n for n in result.notes)


# ---- DeepSpeed: the batch check on the route the export names -------------------------------------

def _route_world(plan, result):
    """(mpu, the data-parallel size DeepSpeed's batch check uses) on the export's launch route."""
    if plan.strategy.pp > 1:
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        ns: dict = {}
        exec(compile(result.files["pipeline_settings.py"], "pipeline_settings.py", "exec"), ns)  # noqa: S102
        topo = PipeModelDataParallelTopology(num_pp=ns["NUM_STAGES"], num_mp=ns["TENSOR_PARALLEL"],
                                             num_dp=ns["DATA_PARALLEL"])
        # deepspeed.initialize takes PipelineModule.mpu(), whose data-parallel size is the topology's data axis
        return MPU(topo.get_dim("data")), topo.get_dim("data")
    cfg = json.loads(result.files["ds_config.json"])
    return None, plan.strategy.devices // cfg.get("sequence_parallel_size", 1)


def test_deepspeed_batch_check_holds_on_the_named_route(monkeypatch):
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_config_module
    from deepspeed.runtime.config import DeepSpeedConfig

    checked = 0
    for name, plan in plans().items():
        if (name, "deepspeed") in REFUSED:      # refused with the engine's reason (test_export_deepspeed.py)
            continue
        result = export_plan(plan, "deepspeed")
        s = plan.strategy
        monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(ds_config_module.dist, "get_world_size", lambda *a, _w=s.devices, **k: _w)
        mpu, world = _route_world(plan, result)
        parsed = DeepSpeedConfig(json.loads(result.files["ds_config.json"]), mpu=mpu)   # asserts the batch equation
        assert parsed.train_batch_size == s.micro_batch_size * s.num_micro_batches * world, name
        # and a step trains the plan's batch: micro x accumulation x the real data-parallel degree
        assert parsed.train_micro_batch_size_per_gpu * parsed.gradient_accumulation_steps * s.dp \
            == plan.training.global_batch_size, name
        checked += 1
    assert checked == len(plans()) - sum(t == "deepspeed" for _, t in REFUSED)


def test_deepspeed_refuses_cp_with_pp_and_tp_without_autotp():
    plan = make_plan("llama3-8b", "dgx-h100", 2, {"dp": 2, "tp": 2, "pp": 2, "cp": 2, "micro_batch_size": 1,
                                                  "num_micro_batches": 8, "zero_stage": 1},
                     global_batch_size=16, seq_length=8192)
    with pytest.raises(AdvisorError, match="parallel.cp = 2 with pp = 2: .*no sequence axis"):
        export_plan(plan, "deepspeed")
    with pytest.raises(AdvisorError, match="parallel.tp = 2: DeepSpeed 0.15 has no AutoTP"):
        export_plan(plans()["llama8b_cp_zero3_offload"], "deepspeed", "0.15")


# ---- MindFormers: MoE plans keep their experts ---------------------------------------------------

def test_mindformers_moe_section():
    plan = plans()["mixtral_ep_vpp"]
    result = export_plan(plan, "mindspore")
    doc = yaml.safe_load(result.files["mindformers_parallel.yaml"])
    moe = doc["moe_config"]
    m = plan.model.moe
    assert (moe["expert_num"], moe["num_experts_chosen"], moe["moe_intermediate_size"], moe["expert_model_parallel"]) \
        == (m.num_experts, m.top_k, m.expert_ffn_hidden_size, plan.strategy.ep)
    # dropless: ceil(k x tokens x factor / experts) >= tokens (MoEConfig's capacity)
    tokens = 4096
    assert -(-m.top_k * tokens * moe["capacity_factor"] // m.num_experts) >= tokens
    assert doc["use_legacy"] is True and "MindFormers 2.1.0" in result.files["mindformers_parallel.yaml"]
    assert "moe_config" not in yaml.safe_load(export_plan(plans()["llama8b_dp_drec"], "mindspore")
                                              .files["mindformers_parallel.yaml"])


def test_torchtitan_serves_the_toml_releases():
    assert supported_versions("torchtitan") == (("0.2.0", "0.2.1", "0.2.2"), "0.2.2")
    with pytest.raises(AdvisorError, match="0.2.0, 0.2.1, 0.2.2"):
        export_plan(plans()["llama8b_dp_drec"], "torchtitan", "0.3")


# ---- the CLI prints the notes in text mode ----------------------------------------------------------

def _advisor(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def test_cli_prints_notes_and_refuses_unknown_versions(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(plans()["llama8b_dp_drec"], path)
    r = _advisor("export", str(path), "--to", "megatron", "--out", str(tmp_path / "m.sh"))
    assert r.returncode == 0, r.stderr
    assert "note: learning-rate flags" in r.stderr and "note: DATA_ARGS trains on mock data" in r.stderr
    r = _advisor("export", str(path), "--to", "deepspeed", "--target-version", "0.7")
    assert r.returncode == 2 and "supports 0.15, 0.16" in r.stderr and "Traceback" not in r.stderr
    r = _advisor("export", str(path), "--to", "k8s", "--target-version", "0.14", "--json")
    assert r.returncode == 0 and "note:" not in r.stderr
    assert "core_v0.14.0" in json.loads(r.stdout)["files"]["pytorchjob.yaml"]
