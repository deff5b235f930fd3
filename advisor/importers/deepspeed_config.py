"""A DeepSpeed configuration as advisor's settings (``--from FILE``): a ``ds_config.json``, or the launch script
that names it.

* ``ds_config.json``: keys as deepspeed/runtime/config.py and zero/config.py read them (the configuration
  reference, https://www.deepspeed.ai/docs/config-json/). Every key is read into a setting, listed as
  price-neutral with its reason, or refused naming the file, the key and its value.
* A launch script (``deepspeed --num_nodes N --num_gpus G train.py --deepspeed --deepspeed_config X.json``):
  the launcher's counts give the cluster, the config it names is read as above (a path relative to the script's
  folder), and the pipeline settings the export writes beside it (``pipeline_settings.py``: NUM_STAGES,
  TENSOR_PARALLEL, DATA_PARALLEL, EP_SIZE, STAGE_LAYERS) are read as literals, never run. The training script's
  own arguments are refused: advisor does not know what a user's script does with them.

DeepSpeed keeps the pipeline degree in the model's code (PipelineModule(num_stages=...)), not in ds_config: read
from a ds_config.json alone, give --pp (and --tp for the pipeline's model axis) on the command line. The export
(advisor.export.deepspeed) writes only keys read here, so an exported plan reads back as itself.
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.importers._records import read_spelled, spelled_paths
from advisor.importers.imported import Imported, flatten, read_text, refuse, where
from advisor.space.strategy import DEFAULT_MESH_ORDER
from advisor.specs import limits
from advisor.specs.frameworks import FRAMEWORKS
from advisor.specs.untrusted import check_tree, parse, prefix

TARGET = "deepspeed"
DEFAULT_BUCKET = FRAMEWORKS[TARGET].bucket_params    # DeepSpeed's reduce_bucket_size default: no bucket of its own

# keys (dotted paths) that do not change a step's time or memory as advisor prices it, and why
NEUTRAL = {
    **dict.fromkeys(("steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown"), "logging"),
    **dict.fromkeys(("gradient_clipping", "prescale_gradients", "gradient_predivide_factor"),
                    "a hyper-parameter (one scaling of the gradients)"),
    **dict.fromkeys(("fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window", "fp16.hysteresis",
                     "fp16.min_loss_scale", "fp16.consecutive_hysteresis"), "loss scaling, a hyper-parameter"),
    "zero_optimization.contiguous_gradients": "a copy into one buffer, in the priced gradient memory",
    "zero_optimization.offload_optimizer.pin_memory": "pinned host buffers (host memory only)",
    "zero_optimization.offload_param.pin_memory": "pinned host buffers (host memory only)",
    "zero_optimization.allgather_bucket_size": "read with reduce_bucket_size (the export writes both from one size)",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoints, not a step",
    "pipeline.pipe_partitioned": "DeepSpeed's default, as priced",
    "pipeline.grad_partitioned": "DeepSpeed's default, as priced",
    "pipeline.seed_layers": "initialisation",
    "activation_checkpointing.contiguous_memory_optimization": "a copy into one buffer, in the priced activations",
    "activation_checkpointing.synchronize_checkpoint_boundary": "a device synchronisation (timing only)",
    "activation_checkpointing.profile": "logging",
    "activation_checkpointing.number_checkpoints": "read with the model's layers",
}
NEUTRAL_SECTIONS = {"scheduler": "a hyper-parameter", "tensorboard": "logging", "wandb": "logging",
                    "csv_monitor": "logging", "comms_logger": "logging", "flops_profiler": "logging",
                    "checkpoint": "checkpoints, not a step", "aio": "NVMe I/O settings (no NVMe offload is read)"}
OPTIMIZER_PARAMS = {"lr", "betas", "eps", "weight_decay", "momentum", "bias_correction", "amsgrad"}
OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}
# launcher flags (deepspeed/launcher/runner.py) that place the processes, not the step
LAUNCHER_NEUTRAL = {"--hostfile", "-H", "--master_addr", "--master_port", "--launcher", "--ssh_port",
                    "--no_ssh_check", "--force_multi", "--enable_each_rank_log", "--save_pid"}
LAUNCHER_COUNTS = {"--num_nodes": "nodes", "--num_gpus": "gpus", "--num_accelerators": "gpus"}
PIPELINE_CONSTANTS = {"NUM_STAGES": "pp", "TENSOR_PARALLEL": "tp", "DATA_PARALLEL": "dp", "EP_SIZE": "ep",
                      "STAGE_LAYERS": "stage_layers"}


def _int(source: str, key: str, value: Any, low: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)                       # 5e8 as JSON writes it
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise refuse(source, key, value, f"an integer of at least {low} is needed")
    return value


def _enabled(source: str, flat: dict, section: str) -> bool:
    value = flat.pop(f"{section}.enabled", False)
    if not isinstance(value, bool):
        raise refuse(source, f"{section}.enabled", value, "true or false")
    return value


def read_ds_config(text: str, source: str, devices: int | None = None,
                   pipeline: dict[str, Any] | None = None) -> Imported:
    """The settings of a ds_config.json (``devices``: the launcher's count; ``pipeline``: the export's pipeline
    constants by Strategy field)."""
    doc = parse(text, where(source), "json")          # bounded: nesting, sizes and constants (advisor.specs.untrusted)
    check_tree(doc, where(source))
    if not isinstance(doc, dict):
        raise AdvisorError(f"{where(source)}: a DeepSpeed config is a JSON object, got {type(doc).__name__}")
    checkpointing = "activation_checkpointing" in doc        # the section on: every layer checkpointed
    flat = {k: v for k, v in flatten(doc).items()
            if k not in NEUTRAL and k.split(".")[0] not in NEUTRAL_SECTIONS}
    job, strategy, spelled = read_spelled(TARGET, flat)
    for path in spelled_paths(TARGET) & set(flat):
        if path not in spelled:
            raise refuse(source, path, flat[path], "a value advisor does not price")
    for path in spelled:
        flat.pop(path)
    job.update(framework=TARGET, dropout=False)
    strategy.update(pipeline or {})
    strategy.setdefault("mesh_order", DEFAULT_MESH_ORDER)     # PipeModelDataParallelTopology: pipe > data > model
    _precision(flat, job, source)
    _optimizer(flat, job, source)
    _zero(flat, job, strategy, source)
    _recompute(flat, strategy, checkpointing, source)
    _degrees(flat, strategy, source)
    _batch(flat, job, strategy, devices, source)
    for key, value in flat.items():
        raise refuse(source, key, value)
    return Imported(source=source, framework=TARGET, job=job, strategy=strategy, devices=devices)


def _precision(flat: dict, job: dict, source: str) -> None:
    bf16, fp16 = _enabled(source, flat, "bf16"), _enabled(source, flat, "fp16")
    if bf16 and fp16:
        raise refuse(source, "fp16.enabled", True, "bf16 and fp16 cannot both be on")
    if flat.pop("fp16.auto_cast", False):
        raise refuse(source, "fp16.auto_cast", True, "advisor prices fp16 weights, not autocast")
    job["dtype"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"


def _optimizer(flat: dict, job: dict, source: str) -> None:
    name = flat.pop("optimizer.type", None)
    if name is None:
        return
    if str(name).lower() not in OPTIMIZERS:
        raise refuse(source, "optimizer.type", name, f"advisor prices {', '.join(OPTIMIZERS)}")
    job["optimizer"] = OPTIMIZERS[str(name).lower()]
    torch_adam = flat.pop("optimizer.params.torch_adam", False)
    if job["optimizer"] != "sgd":
        job["optimizer_impl"] = "unfused" if torch_adam is True else "fused"
    if flat.pop("optimizer.params.adam_w_mode", True) is False and job["optimizer"] == "adamw":
        raise refuse(source, "optimizer.params.adam_w_mode", False, "AdamW with adam_w_mode false is Adam: name it so")
    for key in [k for k in flat if k.startswith("optimizer.params.")]:
        if key.split(".")[-1] in OPTIMIZER_PARAMS:
            flat.pop(key)                         # hyper-parameters


def _zero(flat: dict, job: dict, strategy: dict, source: str) -> None:
    stage = _int(source, "zero_optimization.stage", flat.pop("zero_optimization.stage", 0), low=0)
    if stage > 3:
        raise refuse(source, "zero_optimization.stage", stage, "ZeRO stages are 0 to 3")
    strategy["zero_stage"] = stage
    overlap = flat.pop("zero_optimization.overlap_comm", None)
    if overlap is not None:
        if not isinstance(overlap, bool):
            raise refuse(source, "zero_optimization.overlap_comm", overlap, "true or false")
        job["overlap_grad_reduce"] = overlap
    if flat.pop("zero_optimization.reduce_scatter", True) is not True:
        raise refuse(source, "zero_optimization.reduce_scatter", False, "advisor prices the gradients reduce-"
                      "scattered over the data-parallel ranks (DeepSpeed's default)")
    device = flat.pop("zero_optimization.offload_optimizer.device", "none")
    if device not in ("cpu", "none"):
        raise refuse(source, "zero_optimization.offload_optimizer.device", device, "advisor prices cpu offload only")
    if device == "cpu":
        strategy["offload_optimizer"] = True
        ratio = flat.pop("zero_optimization.offload_optimizer.ratio", 1.0)
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
            raise refuse(source, "zero_optimization.offload_optimizer.ratio", ratio, "a fraction in (0, 1]")
        if ratio != 1.0:
            strategy["offload_fraction"] = float(ratio)
    param = flat.pop("zero_optimization.offload_param.device", "none")
    if param not in ("cpu", "none"):
        raise refuse(source, "zero_optimization.offload_param.device", param, "advisor prices cpu offload only")
    if param == "cpu":
        strategy["offload_params"] = True
    bucket = flat.pop("zero_optimization.reduce_bucket_size", None)
    if bucket is not None and _int(source, "zero_optimization.reduce_bucket_size", bucket) != DEFAULT_BUCKET:
        if stage >= 2:
            raise refuse(source, "zero_optimization.reduce_bucket_size", bucket, "advisor prices a bucket size of "
                          f"its own with ZeRO stage 0 or 1 only (stage {stage} at DeepSpeed's {DEFAULT_BUCKET:.0e})")
        strategy["bucket_params"] = int(bucket)


def _recompute(flat: dict, strategy: dict, every: bool, source: str) -> None:
    """DeepSpeed's checkpointing section (deepspeed.checkpointing, called by the model on every layer, as the
    export writes it) or the pipeline engine's checkpoint interval."""
    section = {k: flat.pop(k) for k in [k for k in flat if k.startswith("activation_checkpointing")]}
    for key in ("partition_activations", "cpu_checkpointing"):
        if section.pop(f"activation_checkpointing.{key}", False) is not False:
            raise refuse(source, f"activation_checkpointing.{key}", True, "advisor prices checkpoints kept whole on "
                          "the device")
    for key, value in section.items():
        if key != "activation_checkpointing":
            raise refuse(source, key, value)
    interval = flat.pop("pipeline.activation_checkpoint_interval", None)
    if interval is not None:
        interval = _int(source, "pipeline.activation_checkpoint_interval", interval, low=0)
        if interval > 1:
            raise refuse(source, "pipeline.activation_checkpoint_interval", interval, "advisor prices every layer "
                          "(1) or none (0) checkpointed")
    strategy["recompute"] = "full" if (interval == 1 or (interval is None and every)) else "none"


def _degrees(flat: dict, strategy: dict, source: str) -> None:
    for key in ("pipeline.stages", "pipeline.partition"):
        if key in flat and flat[key] not in ("auto", "parameters", "uniform"):
            raise refuse(source, key, flat[key])
        flat.pop(key, None)
    autotp = flat.pop("tensor_parallel.autotp_size", None)
    if autotp is not None:
        strategy["tp"] = _int(source, "tensor_parallel.autotp_size", autotp)
    cp = flat.pop("sequence_parallel_size", None)
    if cp is not None:
        strategy["cp"] = _int(source, "sequence_parallel_size", cp)
        if strategy["cp"] > 1:
            strategy["cp_comm"] = "a2a"           # DeepSpeed-Ulysses: all-to-all over the attention heads


def _batch(flat: dict, job: dict, strategy: dict, devices: int | None, source: str) -> None:
    mbs = _int(source, "train_micro_batch_size_per_gpu", flat.pop("train_micro_batch_size_per_gpu", 1))
    strategy["micro_batch_size"] = mbs
    gas = flat.pop("gradient_accumulation_steps", None)
    gas = None if gas is None else _int(source, "gradient_accumulation_steps", gas)
    gbs = flat.pop("train_batch_size", None)
    tp, cp, pp = strategy.get("tp", 1), strategy.get("cp", 1), strategy.get("pp", 1)
    dp = strategy.get("dp") or (devices // (tp * cp * pp) if devices and devices % (tp * cp * pp) == 0 else None)
    if gbs is not None:
        job["global_batch_size"] = _int(source, "train_batch_size", gbs)
    elif gas is not None and dp is not None:
        job["global_batch_size"] = mbs * gas * dp           # what DeepSpeed derives: micro x accumulation x dp
    elif gas is not None:
        raise refuse(source, "gradient_accumulation_steps", gas, "without train_batch_size the batch is micro x "
                      "accumulation x data-parallel ranks: read the launch script that gives the cluster, or add "
                      "train_batch_size")
    if gas is not None and dp is not None and job["global_batch_size"] != mbs * gas * dp:
        raise refuse(source, "train_batch_size", job["global_batch_size"], f"DeepSpeed asserts it equals micro "
                      f"{mbs} x accumulation {gas} x data parallel {dp} = {mbs * gas * dp}")


# ---- the launch script ---------------------------------------------------------------------------


def read_deepspeed_launch(text: str, source: str) -> Imported:
    """A script running DeepSpeed's launcher: its counts, the config it names, the export's pipeline settings."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise AdvisorError(f"{where(source)}: cannot split it into words as bash would: {exc}") from None
    if "deepspeed" not in words:
        raise AdvisorError(f"{where(source)}: no deepspeed launcher command in it")
    words = words[words.index("deepspeed") + 1:]
    counts: dict[str, int] = {}
    config = None
    i = 0
    while i < len(words) and words[i].startswith("-"):       # the launcher's own flags, up to the script
        flag, eq, value = words[i].partition("=")
        if not eq and flag not in ("--no_ssh_check", "--force_multi", "--enable_each_rank_log"):
            i += 1
            value = words[i] if i < len(words) else ""
        if flag in LAUNCHER_COUNTS:
            counts[LAUNCHER_COUNTS[flag]] = _int(source, flag, _number(source, flag, value))
        elif flag not in LAUNCHER_NEUTRAL:
            raise refuse(source, flag, value, "a launcher flag advisor does not read")
        i += 1
    rest = words[i + 1:]                                       # after the training script
    j = 0
    while j < len(rest):
        word = rest[j]
        if word == "--deepspeed":
            j += 1
            continue
        if word in ("--deepspeed_config", "--deepspeed-config") and j + 1 < len(rest):
            config = rest[j + 1]
            j += 2
            continue
        if word.startswith("--deepspeed_config="):
            config = word.partition("=")[2]
            j += 1
            continue
        raise refuse(source, "train.py argument", word, "the training script's own arguments are not read (advisor "
                      "cannot know what the script does with them); price ds_config.json with the flags instead")
    if config is None:
        raise AdvisorError(f"{where(source)}: the script names no --deepspeed_config")
    folder = Path(source).parent
    devices = counts["nodes"] * counts["gpus"] if {"nodes", "gpus"} <= set(counts) else None
    pipeline = _pipeline_constants(folder / "pipeline_settings.py")
    return read_ds_config(read_text(folder / config), str(folder / config), devices=devices, pipeline=pipeline)


def _number(source: str, flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise AdvisorError(f"{where(source)}: {flag} takes an integer, got {prefix(value)}") from None


def _pipeline_constants(path: Path) -> dict[str, Any] | None:
    """The export's pipeline_settings.py constants (literals only, the file never run), by Strategy field."""
    if not path.is_file():
        return None
    if path.stat().st_size > limits.MAX_YAML_BYTES:
        raise AdvisorError(f"{where(str(path))}: larger than {limits.MAX_YAML_BYTES} bytes")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise AdvisorError(f"{where(str(path))}: not a Python file advisor can read: {exc}") from None
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in PIPELINE_CONSTANTS:
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    raise AdvisorError(f"{where(str(path))}: {name} is not a literal") from None
                out[PIPELINE_CONSTANTS[name]] = value
    if out.get("pp", 1) == 1:
        # the pp = 1 route builds no PipelineModule: ds_config and the launcher give the degrees, the MoE layers' ep_size
        # the experts
        out = {"ep": out["ep"]} if "ep" in out else {}
    for key in ("pp", "tp", "dp", "ep"):
        if key in out and (not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1):
            raise refuse(str(path), key, out[key], "a positive integer is needed")
    layers = out.get("stage_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(x, int) and x >= 0 for x in layers):
            raise refuse(str(path), "STAGE_LAYERS", layers, "a list of layer counts is needed")
        out["stage_layers"] = tuple(layers)
    if out.get("ep", 1) == 1:
        out.pop("ep", None)
    return out
