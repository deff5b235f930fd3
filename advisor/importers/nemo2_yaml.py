"""A NeMo 2 recipe serialised as YAML (``--from FILE``): what ``nemo llm pretrain --factory RECIPE --to-yaml``
writes, and NeMo-Run's fiddle configs print (``_target_`` per object: nemo.collections.llm.api.pretrain with its
data, model, trainer, optim, log and resume arguments).

NeMo 2 runs Megatron-Core through NeMo's Lightning strategy, under the names Megatron-Bridge's ConfigContainer
uses for the same dataclasses, so the file is translated into those sections and read by
advisor.importers.megatron_bridge (one reading of Megatron's settings for every launcher):

* ``trainer.strategy`` (MegatronStrategy: tensor/pipeline/virtual/context/expert parallel sizes, sequence_parallel)
  -> ``model``; ``trainer.strategy.ddp`` (DistributedDataParallelConfig) -> ``ddp``;
* ``model.config`` (the model's config class, e.g. Llama3Config8B, and its overrides) -> ``model`` (the class is
  checked against ``--model`` through KNOWN_MODELS; the overrides are TransformerConfig fields);
* ``data`` (global_batch_size, micro_batch_size, seq_length) -> ``train`` and ``dataset``;
* ``optim.config`` (OptimizerConfig) -> ``optimizer``;
* ``trainer.plugins`` (MegatronMixedPrecision: precision "bf16-mixed" / "16-mixed" / "32", fp8, fp8_recipe,
  fp8_param_gather, grad_reduce_in_fp32) -> ``mixed_precision``;
* ``trainer.callbacks``: MegatronCommOverlapCallback's fields -> ``comm_overlap``; the timing, garbage-collection,
  FLOPs, profiling and checkpoint callbacks are price-neutral; any other callback is refused;
* ``trainer.num_nodes`` x ``trainer.devices``: the cluster; ``log``, ``resume``, the learning-rate schedule,
  ``data``'s paths and tokenizer and the trainer's step counts and logging are price-neutral.

Any other key is refused naming the file, the key and the value. Nothing in the file is imported or run: a
``_target_`` is read as a name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from advisor.errors import AdvisorError
from advisor.importers.imported import Imported, refuse, where
from advisor.specs.untrusted import check_tree, parse

# The API functions whose arguments are a training run (nemo/collections/llm/api.py)
ENTRY_POINTS = ("nemo.collections.llm.api.pretrain", "nemo.collections.llm.api.train")
# NeMo 2's model config classes (nemo/collections/llm/gpt/model/*.py) -> the bundled model they describe
KNOWN_MODELS = {
    "Llama2Config7B": "llama2-7b", "Llama2Config13B": "llama2-13b", "Llama2Config70B": "llama2-70b",
    "Llama3Config8B": "llama3-8b", "Llama3Config70B": "llama3-70b",
    "Llama31Config8B": "llama3-8b", "Llama31Config70B": "llama3-70b", "Llama31Config405B": "llama3-405b",
    "MixtralConfig8x7B": "mixtral-8x7b", "DeepSeekV3Config": "deepseek-v3",
    "Qwen3Config30B_A3B": "qwen3-30b-a3b", "Qwen3Config235B_A22B": "qwen3-235b-a22b",
    "GPTConfig175B": "gpt3-175b",
}
# the shape a known config class stands for, checked against --model (advisor.importers.check_model)
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
STRATEGY_LAYOUT = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                   "context_parallel_size", "sequence_parallel", "expert_model_parallel_size",
                   "expert_tensor_parallel_size", "num_layers_in_first_pipeline_stage",
                   "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
                   "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout", "use_tp_pp_dp_mapping")
_CKPT = "checkpoint saving and loading"
STRATEGY_NEUTRAL = {
    "ckpt_async_save": _CKPT, "ckpt_parallel_load": _CKPT, "ckpt_parallel_save": _CKPT, "ckpt_load_optimizer": _CKPT,
    "ckpt_save_optimizer": _CKPT, "ckpt_load_strictness": _CKPT, "ckpt_include_optimizer": _CKPT,
    "ckpt_parallel_save_optim": _CKPT, "ckpt_load_directly_on_device": _CKPT, "save_ckpt_format": _CKPT,
    "gradient_as_bucket_view": "a view on the gradient buffer (no copy)", "pipeline_dtype": "the compute dtype's",
    "use_te_rng_tracker": "random-number bookkeeping", "find_unused_parameters": "a DDP check",
    "process_group_backend": "process-group set-up", "timeout": "process-group set-up",
    "progress_interval": "logging", "init_model_parallel": "process-group set-up", "setup_optimizers": "set-up",
    "lazy_init": "set-up", "ckpt_load_main_params": _CKPT, "replace_progress_bar": "logging",
}
TRAINER_NEUTRAL = {
    "accelerator": "the devices are the profile's", "max_steps": "the run's length", "max_epochs": "the run's length",
    "max_time": "the run's length", "limit_val_batches": "evaluation", "limit_test_batches": "evaluation",
    "val_check_interval": "evaluation", "num_sanity_val_steps": "evaluation", "log_every_n_steps": "logging",
    "logger": "logging", "enable_checkpointing": _CKPT, "use_distributed_sampler": "data loading",
    "enable_progress_bar": "logging", "enable_model_summary": "logging", "benchmark": "cuDNN autotuning",
    "deterministic": "reproducibility",
}
# callbacks (their class names) that change neither a step's work nor its memory, and why
NEUTRAL_CALLBACKS = {
    "TimingCallback": "timing", "GarbageCollectionCallback": "Python garbage collection between steps",
    "FLOPsMeasurementCallback": "reporting", "NsysCallback": "profiling", "MemoryProfileCallback": "profiling",
    "ModelCheckpoint": _CKPT, "PreemptionCallback": "fault tolerance", "DdpParityChecker": "a check",
    "LearningRateMonitor": "logging", "ParameterDebugger": "debugging",
}
COMM_OVERLAP_CALLBACK = "MegatronCommOverlapCallback"
DATA_READ = {"global_batch_size": ("train", "global_batch_size"), "micro_batch_size": ("train", "micro_batch_size"),
             "seq_length": ("dataset", "seq_length")}
PRECISION = {"bf16-mixed": {"bf16": True}, "bf16": {"bf16": True}, "bf16-true": {"bf16": True},
             "16-mixed": {"fp16": True}, "16": {"fp16": True}, "32": {}, "32-true": {}}
PLUGIN_KEYS = ("fp8", "fp8_recipe", "fp8_param_gather", "fp8_params", "grad_reduce_in_fp32", "fp8_margin",
               "fp8_amax_history_len", "fp8_amax_compute_algo", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
               "num_layers_at_end_in_bf16", "autocast_enabled", "params_dtype", "pipeline_dtype", "fp8_dot_product_attention",
               "fp8_multi_head_attention")


def is_nemo2_config(doc: Any) -> bool:
    """A NeMo 2 recipe: a mapping whose ``_target_`` is one of NeMo's training API functions."""
    return isinstance(doc, dict) and doc.get("_target_") in ENTRY_POINTS


def _name(value: Any) -> str | None:
    """The class or function name a serialised object gives ({_target_: a.b.C} -> "C")."""
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        return value["_target_"].rsplit(".", 1)[-1]
    return None


def _section(doc: dict, key: str, source: str) -> dict:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise refuse(source, key, value, "a NeMo 2 recipe argument is a serialised object (a mapping)")
    return value


def read_nemo2(text: str, source: str) -> Imported:
    """The settings a NeMo 2 recipe YAML gives (module docstring)."""
    doc = parse(text, where(source), "yaml")
    check_tree(doc, where(source))
    if not is_nemo2_config(doc):
        raise AdvisorError(f"{where(source)}: not a NeMo 2 recipe (its _target_ is none of {', '.join(ENTRY_POINTS)})")
    bridge: dict[str, dict] = {"model": {}, "train": {}, "dataset": {}, "ddp": {}, "optimizer": {},
                               "mixed_precision": {}, "comm_overlap": {}}
    for key in doc:
        if key not in ("_target_", "_partial_", "data", "model", "trainer", "optim", "log", "resume", "tokenizer"):
            raise refuse(source, key, "...", "not an argument of NeMo's pretrain advisor knows")
    _data(_section(doc, "data", source), bridge, source)
    model_class = _model(_section(doc, "model", source), bridge, source)
    nodes, devices = _trainer(_section(doc, "trainer", source), bridge, source)
    optim = _section(doc, "optim", source)
    for key, value in _section(optim, "config", source).items():
        bridge["optimizer"][key] = value
    for key in optim:
        if key not in ("_target_", "config", "lr_scheduler", "no_weight_decay_cond", "scale_lr_cond", "lr_mult"):
            raise refuse(source, f"optim.{key}", optim[key], "an optimizer-module argument advisor does not price")
    imported = _read_translated(bridge, source)
    if nodes is not None and devices is not None:
        imported = replace(imported, nodes=nodes, devices=nodes * devices)
    if model_class is not None:     # the class's shape, as if the file stated it (its own overrides win)
        from advisor.specs.model import load_model

        named = load_model(KNOWN_MODELS[model_class])
        imported = replace(imported, model={**{k: getattr(named, k) for k in SHAPE_KEYS}, **imported.model})
    return imported


def _data(data: dict, bridge: dict, source: str) -> None:
    for key, value in data.items():
        if key in DATA_READ:
            section, name = DATA_READ[key]
            bridge[section][name] = value
        elif key == "rampup_batch_size" and value is not None:
            raise refuse(source, "data.rampup_batch_size", value, "a batch that grows during the run: advisor prices "
                         "one global batch")
        # the rest names the data: paths, tokenizer, split, workers, seed, index mapping


def _model(model: dict, bridge: dict, source: str) -> str | None:
    """The model config's overrides into the model section; the config class when it is a known one."""
    config = _section(model, "config", source)
    cls = _name(config)
    for key in model:
        if key not in ("_target_", "config", "tokenizer", "optim", "model_transform"):
            raise refuse(source, f"model.{key}", model[key], "a model-module argument advisor does not price")
    for key, value in config.items():
        if key != "_target_":
            bridge["model"][key] = value
    if cls is None:
        return None
    if cls not in KNOWN_MODELS:
        raise refuse(source, "model.config._target_", config["_target_"], "a model config class advisor has no "
                     f"bundled model for (it knows {', '.join(sorted(KNOWN_MODELS))}); give its architecture to "
                     "--model as a description or Hugging Face config.json and the file's shape keys")
    return cls


def _trainer(trainer: dict, bridge: dict, source: str) -> tuple[int | None, int | None]:
    nodes = devices = None
    for key, value in trainer.items():
        if key in ("_target_",) or key in TRAINER_NEUTRAL:
            continue
        if key == "num_nodes":
            nodes = _count(value, "trainer.num_nodes", source)
        elif key == "devices":
            devices = _count(value, "trainer.devices", source)
        elif key == "accumulate_grad_batches":
            if value not in (None, 1):
                raise refuse(source, "trainer.accumulate_grad_batches", value, "NeMo 2 derives the accumulation from "
                             "the global and micro-batch sizes; Lightning's own accumulation is not priced")
        elif key == "strategy":
            _strategy(value, bridge, source)
        elif key == "plugins":
            _plugins(value, bridge, source)
        elif key == "callbacks":
            _callbacks(value, bridge, source)
        else:
            raise refuse(source, f"trainer.{key}", value, "a trainer argument advisor does not price")
    return nodes, devices


def _count(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise refuse(source, key, value, "must be a positive whole number")
    return value


def _strategy(strategy: Any, bridge: dict, source: str) -> None:
    if not isinstance(strategy, dict) or _name(strategy) != "MegatronStrategy":
        raise refuse(source, "trainer.strategy", _name(strategy) or strategy, "advisor reads NeMo's MegatronStrategy")
    fsdp = strategy.get("fsdp")
    if fsdp not in (None, "megatron"):
        raise refuse(source, "trainer.strategy.fsdp", fsdp, "advisor reads Megatron FSDP ('megatron'); NeMo's "
                     "PyTorch FSDP path is priced as --framework pytorch")
    if fsdp == "megatron":       # MegatronStrategy turns Megatron FSDP on in the DDP config it builds
        bridge["ddp"]["use_megatron_fsdp"] = True
    for key, value in strategy.items():
        if key == "_target_" or key in STRATEGY_NEUTRAL:
            continue
        if key in STRATEGY_LAYOUT:
            bridge["model"][key] = value
        elif key == "ddp":
            if isinstance(value, dict):
                ddp = {k: v for k, v in value.items() if k != "_target_"}
                if fsdp is None:     # Megatron-Core's DDP reads the sharding strategy only under Megatron FSDP
                    ddp.pop("data_parallel_sharding_strategy", None)
                bridge["ddp"].update(ddp)
            elif value not in ("megatron", "pytorch"):
                raise refuse(source, "trainer.strategy.ddp", value, "Megatron's DDP ('megatron') or a "
                             "DistributedDataParallelConfig")
        elif key == "fsdp":
            continue                 # read above
        else:
            raise refuse(source, f"trainer.strategy.{key}", value, "a MegatronStrategy argument advisor does not price")


def _plugins(plugins: Any, bridge: dict, source: str) -> None:
    if plugins is None:
        return
    if not isinstance(plugins, dict) or _name(plugins) != "MegatronMixedPrecision":
        raise refuse(source, "trainer.plugins", _name(plugins) or plugins, "advisor reads NeMo's "
                     "MegatronMixedPrecision plugin")
    precision = plugins.get("precision", "32")
    if str(precision) not in PRECISION:
        raise refuse(source, "trainer.plugins.precision", precision, f"one of {', '.join(PRECISION)}")
    bridge["mixed_precision"].update(PRECISION[str(precision)])
    for key, value in plugins.items():
        if key in ("_target_", "precision"):
            continue
        if key not in PLUGIN_KEYS:
            raise refuse(source, f"trainer.plugins.{key}", value, "a mixed-precision setting advisor does not price")
        if key == "fp8_params":      # NeMo's older name of fp8_param_gather
            key = "fp8_param_gather"
        if key in ("params_dtype", "pipeline_dtype"):
            continue                 # the compute dtype's (precision above)
        bridge["mixed_precision"][key] = value


def _callbacks(callbacks: Any, bridge: dict, source: str) -> None:
    if callbacks is None:
        return
    if not isinstance(callbacks, list):
        raise refuse(source, "trainer.callbacks", callbacks, "a list of callbacks")
    for i, cb in enumerate(callbacks):
        name = _name(cb)
        if name == COMM_OVERLAP_CALLBACK:
            bridge["comm_overlap"].update({k: v for k, v in cb.items() if k != "_target_"})
        elif name not in NEUTRAL_CALLBACKS:
            raise refuse(source, f"trainer.callbacks[{i}]", name or cb, "a callback advisor does not know to be "
                         "price-neutral")


def _read_translated(bridge: dict, source: str) -> Imported:
    """The translated sections through the Megatron-Bridge reader, its messages naming the NeMo 2 keys."""
    from advisor.importers.megatron_bridge import read_bridge

    text = yaml.safe_dump({k: v for k, v in bridge.items() if v}, sort_keys=False)
    try:
        return read_bridge(text, source)
    except AdvisorError as exc:
        raise AdvisorError(_nemo_keys(str(exc))) from None


# the Bridge section a NeMo 2 key was moved to -> where the NeMo 2 file has it (for messages)
_WHERE = (("model.tensor_model_parallel_size", "trainer.strategy.tensor_model_parallel_size"),
          ("ddp.", "trainer.strategy.ddp."), ("optimizer.", "optim.config."),
          ("mixed_precision.", "trainer.plugins."), ("comm_overlap.", "trainer.callbacks[MegatronCommOverlapCallback]."),
          ("train.", "data."), ("dataset.", "data."))


def _nemo_keys(message: str) -> str:
    for bridge_key, nemo_key in _WHERE:
        message = message.replace(f": {bridge_key}", f": {nemo_key}")
    for key in STRATEGY_LAYOUT:
        message = message.replace(f": model.{key}", f": trainer.strategy.{key}")
    return message.replace(": model.", ": model.config.")
