"""#29: a NeMo 2 recipe as YAML (nemo llm pretrain --factory ... --to-yaml; advisor.importers.nemo2_yaml) is priced
as the Megatron-LM flags it stands for; every key is read, listed as neutral, or refused naming the NeMo key."""

from __future__ import annotations

import pytest
import yaml

from advisor.commands.estimate_request import estimate_request
from advisor.errors import AdvisorError
from advisor.importers import read_launch_config
from advisor.importers.megatron_args import read_megatron

# the shape of a recipe NeMo 2 serialises (fiddle: one _target_ per object), Llama 3 8B with context parallelism and
# FP8 current scaling on one node
RECIPE = """_partial_: true
_target_: nemo.collections.llm.api.pretrain
data:
  _target_: nemo.collections.llm.gpt.data.pre_training.PreTrainingDataModule
  global_batch_size: 128
  micro_batch_size: 1
  paths: [/data/x]
  seq_length: 8192
  tokenizer:
    _target_: nemo.collections.common.tokenizers.huggingface.auto_tokenizer.AutoTokenizer
    pretrained_model_name: meta-llama/Llama-3.1-8B
    use_fast: true
log:
  _target_: nemo.lightning.nemo_logger.NeMoLogger
  ckpt: null
  name: default
model:
  _target_: nemo.collections.llm.gpt.model.llama.LlamaModel
  config:
    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B
    cross_entropy_fusion_impl: te
    enable_cuda_graph: false
optim:
  _target_: nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule
  config:
    _target_: megatron.core.optimizer.optimizer_config.OptimizerConfig
    adam_beta1: 0.9
    adam_beta2: 0.95
    adam_eps: 1.0e-05
    bf16: true
    clip_grad: 1.0
    fp16: false
    lr: 0.0003
    optimizer: adam
    use_distributed_optimizer: true
    weight_decay: 0.1
  lr_scheduler:
    _target_: nemo.lightning.pytorch.optim.lr_scheduler.CosineAnnealingScheduler
    constant_steps: 0
    min_lr: 3.0e-05
    warmup_steps: 2000
resume:
  _target_: nemo.lightning.resume.AutoResume
  resume_if_exists: true
trainer:
  _target_: nemo.lightning.pytorch.trainer.Trainer
  accelerator: gpu
  accumulate_grad_batches: 1
  callbacks:
  - _target_: nemo.utils.exp_manager.TimingCallback
  - _target_: nemo.lightning.pytorch.callbacks.garbage_collection.GarbageCollectionCallback
    gc_interval_train: 100
    gc_interval_val: 100
  - _target_: nemo.lightning.pytorch.callbacks.megatron_comm_overlap.MegatronCommOverlapCallback
    overlap_param_gather_with_optimizer_step: false
    tp_comm_overlap: false
  devices: 8
  enable_checkpointing: false
  limit_test_batches: 50
  limit_val_batches: 0
  log_every_n_steps: 1
  logger: false
  max_steps: 10000
  num_nodes: 1
  plugins:
    _target_: nemo.lightning.pytorch.plugins.mixed_precision.MegatronMixedPrecision
    autocast_enabled: false
    first_last_layers_bf16: true
    fp8: hybrid
    fp8_param_gather: true
    fp8_recipe: tensorwise
    grad_reduce_in_fp32: false
    num_layers_at_end_in_bf16: 1
    num_layers_at_start_in_bf16: 1
    params_dtype: {_call_: false, _target_: torch.bfloat16}
    pipeline_dtype: {_call_: false, _target_: torch.bfloat16}
    precision: bf16-mixed
  strategy:
    _target_: nemo.lightning.pytorch.strategies.megatron_strategy.MegatronStrategy
    ckpt_async_save: true
    ckpt_parallel_load: true
    context_parallel_size: 2
    ddp:
      _target_: megatron.core.distributed.distributed_data_parallel_config.DistributedDataParallelConfig
      average_in_collective: true
      check_for_nan_in_grad: true
      data_parallel_sharding_strategy: optim_grads_params
      grad_reduce_in_fp32: true
      overlap_grad_reduce: true
      overlap_param_gather: true
    expert_model_parallel_size: 1
    expert_tensor_parallel_size: null
    fsdp: null
    gradient_as_bucket_view: true
    pipeline_dtype: null
    pipeline_model_parallel_size: 1
    sequence_parallel: false
    tensor_model_parallel_size: 1
    use_te_rng_tracker: false
    virtual_pipeline_model_parallel_size: null
  use_distributed_sampler: false
  val_check_interval: 10000
"""
# the same run as Megatron-LM's arguments
FLAGS = ("--num-layers 32 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 2 "
         "--expert-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 128 --seq-length 8192 --bf16 --fp8-format hybrid "
         "--fp8-recipe tensorwise --fp8-param-gather --use-distributed-optimizer --overlap-grad-reduce "
         "--overlap-param-gather --optimizer adam")


def _write(tmp_path, doc) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def test_a_recipe_reads_as_the_megatron_flags_it_stands_for(tmp_path):
    imported = read_launch_config(_write(tmp_path, RECIPE))
    flags = read_megatron(FLAGS, "flags")
    assert imported.framework == "megatron" and (imported.nodes, imported.devices) == (1, 8)
    assert imported.strategy == flags.strategy
    assert imported.job == {**flags.job, "grad_reduce_dtype": imported.job["grad_reduce_dtype"]}
    assert imported.job["dtype"] == "fp8" and imported.job["fp8_recipe"] == "tensorwise"
    # MegatronMixedPrecision's grad_reduce_in_fp32 (false) overrides the DDP config's (true), as NeMo applies it
    assert imported.job["grad_reduce_dtype"] == "bf16"
    assert imported.model["num_layers"] == 32 and imported.model["hidden_size"] == 4096   # Llama3Config8B
    est = estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=_write(tmp_path, RECIPE))
    assert (est.strategy.dp, est.strategy.tp, est.strategy.cp, est.strategy.zero_stage) == (4, 1, 2, 1)
    with pytest.raises(AdvisorError, match="gives num_layers = 32, but --model llama3-70b has 80"):
        estimate_request("llama3-70b", "dgx-h100", None, None, job={}, strategy={}, launch=_write(tmp_path, RECIPE))


def test_megatron_fsdp_is_read_from_the_strategy(tmp_path):
    doc = yaml.safe_load(RECIPE)
    doc["trainer"]["strategy"]["fsdp"] = "megatron"
    assert read_launch_config(_write(tmp_path, doc)).strategy["zero_stage"] == 3       # optim_grads_params
    doc["trainer"]["strategy"]["fsdp"] = "pytorch"
    with pytest.raises(AdvisorError, match="trainer.strategy.fsdp = 'pytorch'"):
        read_launch_config(_write(tmp_path, doc))


@pytest.mark.parametrize("change, words", [
    (lambda d: d["trainer"]["callbacks"].append({"_target_": "my.pkg.SpeedHack"}), "trainer.callbacks[3] = 'SpeedHack'"),
    (lambda d: d["trainer"].update(gradient_clip_val=2.0), "trainer.gradient_clip_val = '2.0'"),
    (lambda d: d["trainer"].update(accumulate_grad_batches=4), "trainer.accumulate_grad_batches = '4'"),
    (lambda d: d["model"]["config"].update(_target_="my.pkg.MyConfig"), "model.config._target_ = 'my.pkg.MyConfig'"),
    (lambda d: d["model"]["config"].update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024),
     "it gives moe = {'num_experts': 8"),
    (lambda d: d["trainer"]["plugins"].update(precision="64"), "trainer.plugins.precision = '64'"),
    (lambda d: d.update(extra={"a": 1}), "extra"),
])
def test_what_changes_the_price_and_is_not_understood_is_refused(tmp_path, change, words):
    doc = yaml.safe_load(RECIPE)
    change(doc)
    with pytest.raises(AdvisorError) as err:
        estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=_write(tmp_path, doc))
    assert words in str(err.value) and "recipe.yaml" in str(err.value)
