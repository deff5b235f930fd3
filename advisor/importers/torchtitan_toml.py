"""A torchtitan job TOML as advisor's settings (``--from FILE``).

Keys as torchtitan 0.2's JobConfig names them (torchtitan/config/job_config.py, v0.2.0): every key of the
sections below is read into a setting, listed as price-neutral with its reason, or refused naming the file,
the key and its value. The export (advisor.export.torchtitan) writes only keys read here, so an exported plan
reads back as itself.
"""

from __future__ import annotations

import tomllib
from typing import Any

from advisor.errors import AdvisorError
from advisor.export.torchtitan_flavors import FLAVORS, shape
from advisor.export.torchtitan import FP8_CONVERTERS, SCHEDULE_NAMES
from advisor.importers.imported import Imported, refuse, where

# the export's tables (advisor.export.torchtitan) read backwards
SCHEDULES = {name: schedule for schedule, name in SCHEDULE_NAMES.items()}
CONVERTERS: dict[str, dict[str, str]] = {}
for _recipe, (_converter, _name) in FP8_CONVERTERS.items():
    CONVERTERS.setdefault(_converter, {})[_name] = _recipe

# whole sections that do not change a step's time or memory as advisor prices it
NEUTRAL_SECTIONS = {"job": "names and folders", "profiling": "profiler output", "metrics": "logging",
                    "checkpoint": "checkpoints", "lr_scheduler": "a hyper-parameter", "validation": "evaluation runs",
                    "comm": "timeouts", "fault_tolerance": "restarts", "experimental": "custom imports"}
# section -> key -> why it does not change the price
NEUTRAL_KEYS = {
    "model": {"name": "the architecture: a flavor torchtitan ships is checked against --model",
              "flavor": "the architecture: a flavor torchtitan ships is checked against --model", "tokenizer_path": "the data",
              "hf_assets_path": "the data", "print_after_conversion": "logging"},
    "optimizer": {"lr": "a hyper-parameter", "eps": "a hyper-parameter", "weight_decay": "a hyper-parameter",
                  "beta1": "a hyper-parameter", "beta2": "a hyper-parameter", "early_step_in_backward": "memory only"},
    "training": {"steps": "the run's length", "max_norm": "a hyper-parameter", "dataset": "the data",
                 "dataset_path": "the data", "seed": "reproducibility", "deterministic": "reproducibility",
                 "gc_freq": "host housekeeping"},
    "parallelism": {"context_parallel_rotate_method": "both rotations are ring attention (cp_comm p2p)"},
    "quantize.linear.float8": {"precompute_float8_dynamic_scale_for_fsdp": "one all-reduce of scales per step"},
}


def _tables(doc: dict, prefix: str = "") -> dict[str, dict]:
    """Section name (dotted) -> its scalar keys."""
    out: dict[str, dict] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_tables(value, f"{name}."))
        else:
            out.setdefault(prefix.rstrip("."), {})[key] = value
    return out


def read_torchtitan(text: str, source: str) -> Imported:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AdvisorError(f"{where(source)}: not a TOML file: {exc}") from None
    tables = _tables(doc)
    job: dict[str, Any] = {"framework": "torchtitan", "dropout": False}
    strategy: dict[str, Any] = {}
    for section, keys in tables.items():
        if section.split(".")[0] in NEUTRAL_SECTIONS:
            continue
        reader = READERS.get(section)
        if reader is None:
            raise refuse(source, f"[{section}]", ", ".join(keys), "a section advisor does not price")
        neutral = NEUTRAL_KEYS.get(section, {})
        reader({k: v for k, v in keys.items() if k not in neutral}, job, strategy, source)
    devices = None
    if "dp" in strategy:        # every degree given: the cluster's size (-1 shards over what --devices leaves)
        devices = strategy["dp"] * strategy["tp"] * strategy["cp"] * strategy["pp"]
    return Imported(source=source, framework="torchtitan", job=job, strategy=strategy, devices=devices,
                    model=_flavor_shape(tables.get("model", {})))


def _flavor_shape(keys: dict) -> dict[str, Any]:
    """The architecture a torchtitan flavor of its own names (advisor.export.torchtitan_flavors), checked against
    --model; a model or flavor torchtitan does not ship (your own registration) states nothing."""
    name, flavor = keys.get("name"), keys.get("flavor")
    args = FLAVORS.get((name, flavor)) if isinstance(name, str) and isinstance(flavor, str) else None
    return {} if args is None else shape(name, args)


def _int(source: str, key: str, value: Any, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise refuse(source, key, value, f"an integer of at least {low} is needed")
    return value


def _parallelism(keys: dict, job: dict, strategy: dict, source: str) -> None:
    k = dict(keys)
    replicate = _int(source, "data_parallel_replicate_degree", k.pop("data_parallel_replicate_degree", 1))
    shard = k.pop("data_parallel_shard_degree", -1)
    if shard != -1:
        shard = _int(source, "data_parallel_shard_degree", shard)
    tp = _int(source, "tensor_parallel_degree", k.pop("tensor_parallel_degree", 1))
    strategy["tp"] = tp
    strategy["cp"] = _int(source, "context_parallel_degree", k.pop("context_parallel_degree", 1))
    strategy["pp"] = pp = _int(source, "pipeline_parallel_degree", k.pop("pipeline_parallel_degree", 1))
    ep = _int(source, "expert_parallel_degree", k.pop("expert_parallel_degree", 1))
    if ep > 1:
        strategy["ep"] = ep
    # torchtitan 0.2's default is 1: with tp > 1 and experts, ep then takes the tensor-parallel ranks too (folded)
    etp = _int(source, "expert_tensor_parallel_degree", k.pop("expert_tensor_parallel_degree", 1))
    if etp not in (1, tp):
        raise refuse(source, "expert_tensor_parallel_degree", etp, f"torchtitan runs 1 or tensor_parallel_degree "
                      f"({tp})")
    if etp == 1 and tp > 1 and ep > 1:
        strategy["fold_experts"] = True
    reshard = k.pop("fsdp_reshard_after_forward", "default")
    cp = strategy["cp"]
    if replicate > 1 and (shard not in (1,) or cp > 1):
        raise refuse(source, "data_parallel_replicate_degree", replicate, "HSDP (replicated and sharded data "
                      "parallelism together, which torchtitan also runs with cp > 1) is not priced; give one of the two")
    if shard == 1 and cp == 1:
        strategy["zero_stage"] = 0
        strategy["dp"] = replicate
    else:
        if reshard not in ("default", "never", "always"):
            raise refuse(source, "fsdp_reshard_after_forward", reshard, "it is default, always or never")
        if reshard == "always" and pp > 1:
            raise refuse(source, "fsdp_reshard_after_forward", reshard, "resharding every micro-batch under "
                          "pipelining is not priced (the default keeps the gathered weights, as priced)")
        strategy["zero_stage"] = 2 if reshard == "never" else 3
        if shard != -1:
            strategy["dp"] = shard
    if pp > 1:
        schedule = k.pop("pipeline_parallel_schedule", "1F1B")
        if schedule not in SCHEDULES:
            raise refuse(source, "pipeline_parallel_schedule", schedule, f"advisor prices {', '.join(SCHEDULES)}")
        strategy["pipeline_schedule"] = SCHEDULES[schedule]
        strategy["micro_batch_size"] = _int(source, "pipeline_parallel_microbatch_size",
                                            k.pop("pipeline_parallel_microbatch_size", 1))
        parts = k.pop("module_fqns_per_model_part", None)
        if parts is not None:
            strategy["model_parts"] = parts
    else:
        for key in ("pipeline_parallel_schedule", "pipeline_parallel_microbatch_size", "module_fqns_per_model_part"):
            k.pop(key, None)
    if k.pop("enable_async_tensor_parallel", False):
        job["tp_comm_overlap"] = True
    if tp > 1:
        strategy["sequence_parallel"] = True       # torchtitan's tensor-parallel plan shards the norms by sequence
    for key, value in k.items():
        raise refuse(source, f"parallelism.{key}", value)


def _training(keys: dict, job: dict, strategy: dict, source: str) -> None:
    k = dict(keys)
    if "global_batch_size" in k:
        job["global_batch_size"] = _int(source, "global_batch_size", k.pop("global_batch_size"))
    if "seq_len" in k:
        job["seq_length"] = _int(source, "seq_len", k.pop("seq_len"))
    strategy["local_batch_size"] = _int(source, "local_batch_size", k.pop("local_batch_size", 8))
    param = k.pop("mixed_precision_param", "bfloat16")
    if param not in ("bfloat16", "float32"):
        raise refuse(source, "training.mixed_precision_param", param, "it is bfloat16 or float32")
    job.setdefault("dtype", "bf16" if param == "bfloat16" else "fp32")
    reduce = k.pop("mixed_precision_reduce", "float32")
    if reduce != "float32":
        raise refuse(source, "training.mixed_precision_reduce", reduce, "torchtitan 0.2 reduces in float32 only")
    if k.pop("enable_cpu_offload", False):
        strategy["offload_optimizer"] = strategy["offload_params"] = True
    for key, value in k.items():
        raise refuse(source, f"training.{key}", value)


def _compile(keys: dict, job: dict, strategy: dict, source: str) -> None:
    """[compile] (torchtitan 0.2 Compile): enable runs torch.compile on the model and the loss (its default
    components), which fuses the memory-bound kernels advisor prices (the fused_kernels setting)."""
    k = dict(keys)
    enable = k.pop("enable", False)
    if not isinstance(enable, bool):
        raise refuse(source, "compile.enable", enable, "true or false")
    job["fused_kernels"] = enable
    if k.pop("backend", "inductor") != "inductor":
        raise refuse(source, "compile.backend", keys.get("backend"), "advisor prices torch.compile's inductor backend")
    components = k.pop("components", ["model", "loss"])
    if sorted(components) != ["loss", "model"]:
        raise refuse(source, "compile.components", components, "advisor prices the model and the loss compiled")
    for key, value in k.items():
        raise refuse(source, f"compile.{key}", value)


def _activation_checkpoint(keys: dict, job: dict, strategy: dict, source: str) -> None:
    k = dict(keys)
    mode = k.pop("mode", "selective")
    option = str(k.pop("selective_ac_option", "2"))
    if mode == "none":
        strategy["recompute"] = "none"
    elif mode == "full":
        strategy["recompute"] = "full"
    elif mode == "selective" and option == "op":
        strategy["recompute"] = "selective"
    else:
        raise refuse(source, "activation_checkpoint.mode", f"{mode} ({option})", "advisor prices none, full and "
                      "selective with selective_ac_option = \"op\"")
    k.pop("per_op_sac_force_recompute_mm_shapes_by_fqns", None)     # the router gate's GEMM: negligible
    for key, value in k.items():
        raise refuse(source, f"activation_checkpoint.{key}", value)


def _model(keys: dict, job: dict, strategy: dict, source: str) -> None:
    k = dict(keys)
    converters = k.pop("converters", [])
    for converter in converters:
        if converter not in CONVERTERS:
            raise refuse(source, "model.converters", converter, f"advisor prices {', '.join(CONVERTERS)}")
        job["dtype"] = "fp8"
        job.setdefault("fp8_recipe", next(iter(CONVERTERS[converter].values())))   # the converter's default recipe
    for key, value in k.items():
        raise refuse(source, f"model.{key}", value)


def _fp8_section(name: str):
    def read(keys: dict, job: dict, strategy: dict, source: str) -> None:
        k = dict(keys)
        recipe = k.pop("recipe_name", None)
        if recipe is not None:
            if recipe not in CONVERTERS[name]:
                raise refuse(source, f"{name}.recipe_name", recipe, f"advisor prices {', '.join(CONVERTERS[name])}")
            job["fp8_recipe"] = CONVERTERS[name][recipe]
        if k.pop("enable_fsdp_float8_all_gather", False):
            job["fp8_param_gather"] = True
        if k.pop("filter_fqns", []) not in ([], ["output"]):
            raise refuse(source, f"{name}.filter_fqns", keys.get("filter_fqns"), "advisor prices every linear "
                          "layer but the output head in FP8")
        for key, value in k.items():
            raise refuse(source, f"{name}.{key}", value)
    return read


def _optimizer(keys: dict, job: dict, strategy: dict, source: str) -> None:
    k = dict(keys)
    name = k.pop("name", "AdamW")
    if name not in ("AdamW", "Adam"):
        raise refuse(source, "optimizer.name", name, "advisor prices AdamW and Adam")
    job["optimizer"] = name.lower()
    impl = k.pop("implementation", "fused")
    if impl not in ("fused", "foreach", "for-loop"):
        raise refuse(source, "optimizer.implementation", impl, "it is fused, foreach or for-loop")
    job["optimizer_impl"] = "fused" if impl == "fused" else "unfused"
    for key, value in k.items():
        raise refuse(source, f"optimizer.{key}", value)


READERS = {"parallelism": _parallelism, "training": _training, "activation_checkpoint": _activation_checkpoint,
           "compile": _compile,
           "model": _model, "optimizer": _optimizer, "quantize.linear.float8": _fp8_section("quantize.linear.float8"),
           "quantize.linear.mx": _fp8_section("quantize.linear.mx")}
