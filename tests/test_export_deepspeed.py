"""DeepSpeed export: ds_config.json parsed by DeepSpeed's own DeepSpeedConfig when DeepSpeed is
installed (it installs on CPU from the registry), and always checked against the documented keys.

Documented keys: DeepSpeed configuration reference https://www.deepspeed.ai/docs/config-json/
(batch size, optimizer, fp16, bf16, gradient_clipping, zero_optimization and offload_optimizer,
activation_checkpointing, steps_per_print, wall_clock_breakdown), the AutoTP training tutorial
https://www.deepspeed.ai/tutorials/autotp-training/ (tensor_parallel.autotp_size), and the keys
deepspeed/runtime/config.py reads (``pipeline``: get_pipeline_config's defaults;
``sequence_parallel_size`` for Ulysses).
"""

from __future__ import annotations

import json
import shlex

import pytest

from _export_plans import REFUSED as REFUSED_PAIRS
from _export_plans import plans
from _release_parse import MPU
from advisor.export import export_plan

DOC_TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "gradient_clipping", "zero_optimization", "activation_checkpointing", "steps_per_print",
    "wall_clock_breakdown", "pipeline", "tensor_parallel", "sequence_parallel_size",
}
DOC_ZERO_KEYS = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "offload_optimizer",
                 "offload_param", "allgather_partitions", "allgather_bucket_size", "reduce_bucket_size"}
DOC_OFFLOAD_KEYS = {"device", "pin_memory", "nvme_path", "buffer_count", "fast_init", "ratio"}
DOC_ACTIVATION_KEYS = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                       "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}
DOC_PIPELINE_KEYS = {"stages", "partition", "seed_layers", "activation_checkpoint_interval", "pipe_partitioned",
                     "grad_partitioned"}
DOC_FP16_KEYS = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                 "consecutive_hysteresis", "min_loss_scale"}


# plans DeepSpeed's engine would reject: the export refuses them with the reason
REFUSED = {name: reason for (name, target), reason in REFUSED_PAIRS.items() if target == "deepspeed"}


@pytest.fixture(scope="module")
def exported():
    return {name: (plan, export_plan(plan, "deepspeed")) for name, plan in plans().items() if name not in REFUSED}


def test_plans_the_engine_rejects_are_refused_with_the_reason():
    from advisor.errors import AdvisorError

    for name, reason in REFUSED.items():
        with pytest.raises(AdvisorError, match=reason):
            export_plan(plans()[name], "deepspeed")


def test_autotp_with_zero3_needs_a_release_that_accepts_it():
    from dataclasses import replace

    from advisor.errors import AdvisorError

    plan = plans()["llama8b_dp_drec"]
    plan = replace(plan, strategy=replace(plan.strategy, dp=plan.strategy.dp // 2, tp=2, pp=1, zero_stage=3))
    assert json.loads(export_plan(plan, "deepspeed", "0.19").files["ds_config.json"])["zero_optimization"]["stage"] == 3
    with pytest.raises(AdvisorError, match="ZeRO stage 2 at most"):
        export_plan(plan, "deepspeed", "0.18")


def _config(result) -> dict:
    return json.loads(result.files["ds_config.json"])


def test_keys_are_documented(exported):
    for name, (plan, result) in exported.items():
        cfg = _config(result)
        assert set(cfg) <= DOC_TOP_KEYS, (name, set(cfg) - DOC_TOP_KEYS)
        assert set(cfg["zero_optimization"]) <= DOC_ZERO_KEYS, name
        if "offload_optimizer" in cfg["zero_optimization"]:
            assert set(cfg["zero_optimization"]["offload_optimizer"]) <= DOC_OFFLOAD_KEYS
        assert set(cfg.get("activation_checkpointing", {})) <= DOC_ACTIVATION_KEYS, name
        assert set(cfg.get("pipeline", {})) <= DOC_PIPELINE_KEYS, name
        assert set(cfg.get("fp16", {})) <= DOC_FP16_KEYS, name
        assert set(cfg.get("tensor_parallel", {})) <= {"autotp_size"}, name


def test_batch_arithmetic_matches_the_plan(exported):
    for name, (plan, result) in exported.items():
        cfg, s = _config(result), plan.strategy
        # docs: train_batch_size = micro batch per GPU x gradient accumulation x data-parallel GPUs
        assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * s.dp \
            == plan.training.global_batch_size, name
        # AutoTP without an mpu (tp > 1, pp = 1): DeepSpeed derives train_batch_size itself (see test_batch_check_...)
        if s.tp > 1 and s.pp == 1:
            assert "train_batch_size" not in cfg, name
        else:
            assert cfg["train_batch_size"] == plan.training.global_batch_size, name
        assert cfg["zero_optimization"]["stage"] == s.zero_stage
        assert ("offload_optimizer" in cfg["zero_optimization"]) == s.offload_optimizer
        assert ("bf16" in cfg) == (plan.training.dtype in ("bf16", "fp8"))
        assert ("fp16" in cfg) == (plan.training.dtype == "fp16")


def _patch_rank(monkeypatch):
    """DeepSpeedConfig asks the process group for this rank before it consults the mpu; without
    torch.distributed initialised it would fall back to a world of 1. Rank 0 is what a launch has."""
    import deepspeed.runtime.config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)


def _precision(parsed, kind: str) -> bool:
    """bf16/fp16 switch as parsed (newer DeepSpeed: *_config.enabled; older: bfloat16_enabled/fp16_enabled)."""
    config = getattr(parsed, f"{kind}_config", None)
    if config is not None:
        return bool(config.enabled)
    return bool(getattr(parsed, "bfloat16_enabled" if kind == "bfloat16" else "fp16_enabled"))


def test_deepspeed_parses_the_config(exported, monkeypatch):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    _patch_rank(monkeypatch)

    for name, (plan, result) in exported.items():
        cfg = _config(result)
        parsed = DeepSpeedConfig(cfg, mpu=MPU(plan.strategy.dp))
        assert parsed.train_batch_size == plan.training.global_batch_size, name
        assert parsed.train_micro_batch_size_per_gpu == plan.strategy.micro_batch_size, name
        assert parsed.gradient_accumulation_steps == plan.strategy.num_micro_batches, name
        assert parsed.zero_optimization_stage == plan.strategy.zero_stage, name
        assert _precision(parsed, "bfloat16") == (plan.training.dtype in ("bf16", "fp8")), name
        assert _precision(parsed, "float16") == (plan.training.dtype == "fp16"), name
        if plan.strategy.offload_optimizer:
            assert parsed.zero_config.offload_optimizer is not None and \
                parsed.zero_config.offload_optimizer.device == "cpu", name
        if plan.strategy.pp > 1:
            # the priced policy only: full recomputation of every layer (a per-stage count is reported instead)
            expected = 1 if (plan.strategy.recompute == "full" and plan.strategy.recompute_layers is None) else 0
            assert parsed.pipeline["activation_checkpoint_interval"] == expected, name


def test_deepspeed_refuses_a_misspelled_key(monkeypatch):
    """The strict parts of DeepSpeedConfig (pydantic models) do refuse unknown keys: the check above bites."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    _patch_rank(monkeypatch)

    cfg = _config(export_plan(plans()["llama8b_dp_drec"], "deepspeed"))
    cfg["zero_optimization"]["stagee"] = 1
    with pytest.raises(Exception):
        DeepSpeedConfig(cfg, mpu=MPU(8))


def test_pipeline_settings_build_deepspeeds_topology(exported):
    pytest.importorskip("deepspeed")
    import inspect

    from deepspeed.pipe import PipelineModule

    params = inspect.signature(PipelineModule.__init__).parameters
    for kw in ("layers", "topology", "loss_fn", "partition_method", "activation_checkpoint_interval"):
        assert kw in params
    for name, (plan, result) in exported.items():
        namespace: dict = {}
        exec(compile(result.files["pipeline_settings.py"], "pipeline_settings.py", "exec"), namespace)  # noqa: S102
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        topo = PipeModelDataParallelTopology(num_pp=namespace["NUM_STAGES"], num_mp=namespace["TENSOR_PARALLEL"],
                                             num_dp=namespace["DATA_PARALLEL"])
        assert topo.world_size() == plan.strategy.devices, name
        assert topo.get_dim("pipe") == plan.strategy.pp and topo.get_dim("model") == plan.strategy.tp
        assert namespace["PARTITION_METHOD"] in ("uniform", "parameters")


def test_launcher_line_parses(exported):
    pytest.importorskip("deepspeed")
    from deepspeed.launcher.runner import parse_args

    for name, (plan, result) in exported.items():
        line = [ln for ln in result.files["launch_deepspeed.sh"].splitlines() if ln.startswith("deepspeed ")][0]
        args = parse_args(shlex.split(line)[1:])
        assert args.num_nodes == plan.cluster.nodes, name
        assert args.user_script == "train.py"


def test_unexpressible_features_are_reported(exported):
    def unsupported(name):
        return " ".join(exported[name][1].unsupported)

    assert "Megatron-style selective recomputation (attention core)" in unsupported("llama70b_uneven_pp")
    assert "stage_layers" in unsupported("llama70b_uneven_pp")
    assert "virtual_pipeline_stages" in unsupported("mixtral_ep_vpp")
    assert "full recomputation of 4 layer(s) per stage" in unsupported("mixtral_ep_vpp")
    assert "gpipe" in unsupported("gpt3_gpipe_fp16")
    assert "cp = 4" in unsupported("llama8b_cp_zero3_offload")
    assert [u.split(":")[0] for u in exported["llama8b_dp_drec"][1].unsupported] == ["training.framework = megatron"]


def test_deepspeed_parses_parameter_offload_and_the_offload_ratio(monkeypatch):
    """offload_param and offload_optimizer.ratio (ZeRO-3) as DeepSpeed's own config classes read them."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    from _export_plans import make_plan

    _patch_rank(monkeypatch)
    parallel = {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 3,
                "offload_optimizer": True}
    for extra, check in (({"offload_params": True}, "param"), ({"offload_fraction": 0.25}, "ratio")):
        plan = make_plan("llama3-8b", "dgx-a100-80g", 1, {**parallel, **extra}, global_batch_size=32,
                         seq_length=4096, framework="deepspeed")
        parsed = DeepSpeedConfig(_config(export_plan(plan, "deepspeed")), mpu=MPU(8))
        zero = parsed.zero_config
        if check == "param":
            assert zero.offload_param is not None and zero.offload_param.device == "cpu"
        else:
            assert zero.offload_optimizer.ratio == pytest.approx(0.25)


def test_deepspeed_parses_an_unfused_optimizer(monkeypatch):
    """training.optimizer_impl = unfused asks DeepSpeed for torch.optim's AdamW (optimizer.params
    torch_adam, popped by DeepSpeedEngine._configure_basic_optimizer before FusedAdam is chosen)."""
    pytest.importorskip("deepspeed")
    from dataclasses import replace

    from deepspeed.runtime.config import DeepSpeedConfig

    _patch_rank(monkeypatch)
    plan = next(p for p in plans().values() if p.training.optimizer == "adamw")
    plan = replace(plan, training=replace(plan.training, framework="pytorch", optimizer_impl="unfused"))
    parsed = DeepSpeedConfig(_config(export_plan(plan, "deepspeed")), mpu=MPU(plan.strategy.dp))
    assert parsed.optimizer_name == "adamw"
    assert parsed.optimizer_params["torch_adam"] is True
