"""--from FILE for DeepSpeed (ds_config.json, or the launch script naming it) and MindFormers (a training YAML):
what advisor exports reads back as the same plan at the same price, a config written by hand is read key by key,
and a key advisor cannot price is refused naming the file, the key and its value."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from advisor.commands.estimate_request import estimate_request
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.search import Pins

LAUNCH = {"deepspeed": "launch_deepspeed.sh", "mindspore": "mindformers_parallel.yaml"}
SETTINGS = [
    ("llama3-8b", "dgx-h100", 64, "deepspeed"),         # ZeRO, AutoTP route
    ("llama3-70b", "dgx-h100", 64, "deepspeed"),        # optimizer offload
    ("mixtral-8x7b", "dgx-h100", 64, "deepspeed"),      # experts (EP_SIZE of pipeline_settings.py), Ulysses
    ("gpt3-175b", "dgx-a100-80g", 512, "deepspeed"),    # the pipeline engine (pipeline_settings.py's degrees)
    ("llama3-70b", "dgx-h100", 64, "mindspore"),        # multi-copy, parameter offload (parallel_context.py)
    ("mixtral-8x7b", "dgx-h100", 64, "mindspore"),      # moe_config
    ("pangu-alpha-13b", "ascend-910b", 32, "mindspore"),
]


def _resolved(s, model):
    return replace(s, stage_layers=tuple(s.resolved_stage_layers(model.num_layers)))


@pytest.mark.parametrize("model,hardware,devices,framework", SETTINGS)
def test_an_export_reads_back_at_the_same_price(tmp_path, model, hardware, devices, framework):
    i = resolve_inputs(model, hardware, devices=devices, framework=framework)
    plans = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=2).plans
    for n, plan in enumerate(plans):
        result = export_plan(plan, framework)
        assert not result.unsupported, result.unsupported
        folder = tmp_path / str(n)
        folder.mkdir()
        for name, text in result.files.items():
            (folder / name).write_text(text)
        back = estimate_request(model, hardware, None, None, job={}, strategy={},
                                launch=str(folder / LAUNCH[framework]))
        assert _resolved(back.strategy, i.model) == _resolved(plan.strategy, i.model), (back.strategy, plan.strategy)
        assert back.inputs.job == plan.training
        assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)
        assert back.estimate.memory_gib.total == pytest.approx(plan.prediction["memory_gib"]["total"], rel=1e-12)


# ---- DeepSpeed, written by hand -------------------------------------------------------------------------
DS_CONFIG = {
    "train_batch_size": 256, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
    "steps_per_print": 100, "gradient_clipping": 1.0, "wall_clock_breakdown": False,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.5}},
    "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False},
    "communication_data_type": "fp32",
}


def test_a_ds_config_is_read_key_by_key(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(DS_CONFIG))
    r = estimate_request("llama3-8b", "dgx-h100", None, 32, job={}, strategy={}, launch=str(path))
    s, j = r.strategy, r.inputs.job
    assert (s.dp, s.micro_batch_size, s.num_micro_batches, s.zero_stage) == (32, 2, 4, 3)
    assert s.offload_optimizer and s.offload_fraction == 0.5 and s.recompute == "full" and s.recompute_layers is None
    assert s.grad_bucket_mb is None                   # 5e8 elements: DeepSpeed's default, the record's bucket
    assert (j.framework, j.dtype, j.optimizer, j.optimizer_impl, j.grad_reduce_dtype, j.global_batch_size) == \
        ("deepspeed", "bf16", "adamw", "fused", "fp32", 256)
    # the pipeline degree is in the model's code: given on the command line, the rest from the file
    piped = estimate_request("llama3-8b", "dgx-h100", None, 32, job={}, strategy={"pp": 2, "zero_stage": 1, "offload_fraction": 1.0},
                             launch=str(path))
    assert (piped.strategy.pp, piped.strategy.dp, piped.strategy.num_micro_batches) == (2, 16, 8)
    own = {**DS_CONFIG, "zero_optimization": {"stage": 1, "reduce_bucket_size": 2e8}}
    path.write_text(json.dumps(own))
    bucketed = estimate_request("llama3-8b", "dgx-h100", None, 32, job={}, strategy={}, launch=str(path))
    assert bucketed.strategy.grad_bucket_mb == pytest.approx(2e8 * 4 / 2 ** 20)   # reduced in fp32: 4 bytes each


def test_a_deepspeed_launch_gives_the_cluster_and_the_batch(tmp_path):
    (tmp_path / "conf").mkdir()
    cfg = {k: v for k, v in DS_CONFIG.items() if k not in ("train_batch_size", "zero_optimization")}
    cfg["tensor_parallel"] = {"autotp_size": 2}
    (tmp_path / "conf" / "ds.json").write_text(json.dumps(cfg))
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\ndeepspeed --num_nodes 2 --num_gpus 8 --hostfile hosts \\\n"
                      "  train.py --deepspeed --deepspeed_config conf/ds.json\n")
    r = estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=str(script))
    # without train_batch_size DeepSpeed derives micro x accumulation x dp, dp = 16 ranks / autotp 2
    assert (r.inputs.cluster.devices, r.strategy.tp, r.strategy.dp, r.inputs.job.global_batch_size) == (16, 2, 8, 64)


@pytest.mark.parametrize("config, words", [
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, ["offload_param.device", "nvme"]),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9}}, ["stage3_max_live_parameters"]),
    ({"fp16": {"enabled": True, "auto_cast": True}}, ["fp16.auto_cast"]),
    ({"train_micro_batch_size_per_gpu": "auto"}, ["train_micro_batch_size_per_gpu", "auto"]),
    ({"activation_checkpointing": {"cpu_checkpointing": True}}, ["cpu_checkpointing"]),
    ({"optimizer": {"type": "Lamb"}}, ["optimizer.type", "Lamb"]),
    ({"communication_data_type": "fp8"}, ["communication_data_type", "fp8"]),
    ({"gradient_accumulation_steps": 4}, ["gradient_accumulation_steps", "launch script"]),
    ({"pipeline": {"activation_checkpoint_interval": 2}}, ["activation_checkpoint_interval", "2"]),
])
def test_a_deepspeed_key_advisor_cannot_price_is_refused(tmp_path, config, words):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))
    with pytest.raises(AdvisorError) as err:
        estimate_request("llama3-8b", "dgx-h100", None, 8, job={}, strategy={}, launch=str(path))
    message = str(err.value)
    assert "bad.json" in message and all(w in message for w in words), message


def test_a_training_scripts_own_arguments_are_refused(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 8}))
    script = tmp_path / "run.sh"
    script.write_text("deepspeed --num_gpus 8 train.py --deepspeed_config ds.json --hidden 4096\n")
    with pytest.raises(AdvisorError, match="run.sh.*--hidden.*own arguments"):
        estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=str(script))


def test_deepspeed_plans_recompute_every_layer_or_none():
    """DeepSpeed's config checkpoints every layer or none (Framework.recompute_kinds): the search offers nothing
    else, and estimate refuses the rest naming the framework."""
    i = resolve_inputs("gpt3-175b", "dgx-a100-80g", devices=512, framework="deepspeed")
    result = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=20)
    assert {(p.strategy.recompute, p.strategy.recompute_layers) for p in result.plans} <= {("none", None),
                                                                                           ("full", None)}
    with pytest.raises(AdvisorError, match="deepspeed launches recompute none, full of every layer"):
        estimate_request("gpt3-175b", "dgx-a100-80g", None, 512, job={"framework": "deepspeed"},
                         strategy={"tp": 4, "pp": 8, "recompute": "selective"})
    with pytest.raises(AdvisorError, match="recompute = full, recompute_layers = 4"):
        estimate_request("gpt3-175b", "dgx-a100-80g", None, 512, job={"framework": "deepspeed"},
                         strategy={"tp": 4, "pp": 8, "recompute": "full", "recompute_layers": "4"})


# ---- MindFormers, written by hand -----------------------------------------------------------------------
MINDFORMERS = """\
seed: 0
run_mode: 'train'
trainer: {type: CausalLanguageModelingTrainer, model_name: 'llama2_7b'}
runner_config: {epochs: 2, batch_size: 2, sink_mode: True, sink_size: 2, gradient_accumulation_steps: 1}
optimizer: {type: FP32StateAdamWeightDecay, beta1: 0.9, beta2: 0.95, eps: 1.e-8}
lr_schedule: {type: CosineWithWarmUpLR, learning_rate: 1.e-5}
train_dataset: &train_dataset
  data_loader: {type: MindDataset, dataset_dir: ""}
  input_columns: ["input_ids"]
train_dataset_task: {type: CausalLanguageModelDataset, dataset_config: *train_dataset}
use_parallel: True
parallel:
  parallel_mode: 1
  gradients_mean: False
  full_batch: True
  enable_parallel_optimizer: True
  parallel_optimizer_config: {gradient_accumulation_shard: False, parallel_optimizer_threshold: 64}
  pipeline_config: {pipeline_interleave: True, pipeline_scheduler: 1f1b}
parallel_config:
  data_parallel: 2
  model_parallel: 4
  pipeline_stage: 2
  use_seq_parallel: True
  micro_batch_num: 16
  vocab_emb_dp: False
  gradient_aggregation_group: 4
micro_batch_interleave_num: 2
recompute_config:
  recompute: [[4, 3], [4, 3]]
  select_recompute: False
  parallel_optimizer_comm_recompute: False
  mp_comm_recompute: True
  recompute_slice_activation: False
context: {mode: 0, device_target: "Ascend", max_device_memory: "58GB", jit_config: {jit_level: "O1"}}
model:
  model_config:
    type: LlamaConfig
    seq_length: 4096
    hidden_size: 4096
    num_layers: 32
    num_heads: 32
    vocab_size: 32000
    multiple_of: 256
    compute_dtype: "bfloat16"
    param_init_type: "float16"
    softmax_compute_type: "float16"
    use_flash_attention: True
    pp_interleave_num: 2
    offset: [[1, -1], [0, 0]]
    fine_grain_interleave: 2
  arch: {type: LlamaForCausalLM}
callbacks: [{type: MFLossMonitor}]
"""


def test_a_mindformers_yaml_is_read_key_by_key(tmp_path):
    path = tmp_path / "run_llama2_7b.yaml"
    path.write_text(MINDFORMERS)
    r = estimate_request("llama2-7b", "ascend-910b", None, None, job={}, strategy={}, launch=str(path))
    s, j = r.strategy, r.inputs.job
    assert (s.dp, s.tp, s.pp, s.virtual_pipeline_stages, s.sequence_parallel) == (2, 4, 2, 2, True)
    assert s.stage_layers == (17, 15)                  # LayerSetting: 32 // 4 + offset, summed over the chunks
    assert s.recompute == "full" and s.recompute_layers == (8, 6) and s.micro_batch_copies == 2
    assert (s.micro_batch_size, s.num_micro_batches, s.zero_stage, s.full_batch) == (4, 16, 1, True)
    assert (j.framework, j.dtype, j.optimizer_impl, j.tp_comm_overlap, j.global_batch_size, j.seq_length) == \
        ("mindspore", "bf16", "unfused", True, 128, 4096)
    assert r.inputs.cluster.devices == 16
    path.write_text(MINDFORMERS.replace("fine_grain_interleave: 2", "fine_grain_interleave: 1"))   # one slice: off
    off = estimate_request("llama2-7b", "ascend-910b", None, None, job={}, strategy={}, launch=str(path))
    assert off.inputs.job.tp_comm_overlap is False


@pytest.mark.parametrize("change, words", [
    (("vocab_emb_dp: False", "vocab_emb_dp: True"), ["parallel_config.vocab_emb_dp", "True"]),
    (("parallel_mode: 1", "parallel_mode: 2"), ["parallel.parallel_mode", "2", "auto_parallel"]),
    (("recompute_slice_activation: False", "recompute_slice_activation: True"), ["recompute_slice_activation"]),
    (("fine_grain_interleave: 2", "fine_grain_interleave: 4"), ["fine_grain_interleave", "4"]),
    (("pp_interleave_num: 2", "pp_interleave_num: 2\n    warp_drive: 9"), ["model.model_config.warp_drive"]),
    (("seed: 0", "mystery: {x: 1}"), ["mystery", "a section advisor does not price"]),
    (("offset: [[1, -1], [0, 0]]", "offset: [1, -1]"), ["model.model_config.offset", "2 list(s) of 2"]),
    (("type: FP32StateAdamWeightDecay", "type: SGD"), ["optimizer.type", "SGD"]),
    (("num_layers: 32", "num_layers: 40"), ["num_layers = 40", "llama2-7b has 32"]),
])
def test_a_mindformers_key_advisor_cannot_price_is_refused(tmp_path, change, words):
    path = tmp_path / "bad.yaml"
    path.write_text(MINDFORMERS.replace(*change))
    with pytest.raises(AdvisorError) as err:
        estimate_request("llama2-7b", "ascend-910b", None, None, job={}, strategy={}, launch=str(path))
    message = str(err.value)
    assert "bad.yaml" in message and all(w in message for w in words), message
