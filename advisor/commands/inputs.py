"""Turn command-line values into specs: the model, the hardware, the cluster and the training job.

Shared by every command that takes --model/--hardware/--nodes|--devices/--gbs/--seq-len/--dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from advisor.errors import AdvisorError
from advisor.families import RECOMMENDATION, SUPERNET, family_of_model
from advisor.specs import limits
from advisor.specs.architectures import architecture_of
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.frameworks import for_release
from advisor.specs.job import Cluster, TrainingJob, check_cuda_graphs, check_job_relations
from advisor.specs.setting import field_default, settings_of
from advisor.specs.model import ModelSpec, load_model
from advisor.specs.untrusted import prefix

# Default global batch: about 4M tokens per step, as Llama 2 and Llama 3 pre-training used
# (Touvron et al. 2023, section 2.2; Dubey et al. 2024, section 3.4.1); GPT-3 175B used 3.2M.
DEFAULT_BATCH_TOKENS = 4 * 2 ** 20


@dataclass(frozen=True)
class Inputs:
    model: ModelSpec
    hardware: HardwareProfile
    cluster: Cluster
    job: TrainingJob


def default_dtype(hardware: HardwareProfile) -> str:
    """bf16 where the device has it, else fp16 (V100, Ascend 910)."""
    peaks = hardware.device.peak_tflops
    return "bf16" if "bf16" in peaks else ("fp16" if "fp16" in peaks else "fp32")


def check_dtype(hw: HardwareProfile, dtype: str) -> str:
    """The dtype, refused naming the profile where its device has no peak for it."""
    if dtype not in hw.device.peak_tflops:
        shown = dtype if dtype.isascii() and dtype.isalnum() and len(dtype) <= 40 else prefix(dtype)
        raise AdvisorError(f"--dtype {shown}: the {hw.device.name} of profile '{hw.name}' has no {shown} peak "
                           f"(it has {', '.join(hw.device.peak_tflops)})")
    return dtype


def check_count(flag: str, value, bound: int, minimum: int = 1) -> int:
    """A whole-number flag within [minimum, bound] (advisor.specs.limits), named in the error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise AdvisorError(f"{flag} must be {kind}, got {prefix(value)}")
    if value > bound:
        raise AdvisorError(f"{flag} {prefix(value)} exceeds the bound {bound:,} advisor accepts (advisor/specs/limits.py)")
    return value


def resolve_inputs(model: str, hardware: str | HardwareProfile, nodes: int | None = None, devices: int | None = None,
                   **job: Any) -> Inputs:
    """The model, the hardware, the cluster and the training job from command-line values: ``job`` holds
    TrainingJob settings by field name (text where the command line gives text: "2T", "attn,mlp"), each
    checked naming its flag; what is not given takes its default (the sequence the model's, the batch
    about 4M tokens, the dtype the device's)."""
    spec = load_model(model)
    if family_of_model(spec) is SUPERNET:
        raise AdvisorError(f"{spec.name} is a supernet (family: supernet): advisor recommend and estimate plan it on "
                           "one hardware profile with NASPipe's schedule (--pp, --global-batch); other options do not apply")
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
    cluster = Cluster.of(hw, nodes=nodes, devices=devices)
    return Inputs(spec, hw, cluster, job_from_values(spec, hw, cluster, job))


def given_settings(cls, values: dict[str, Any]) -> dict[str, Any]:
    """The given (not None) settings of a config class, parsed and checked, each error naming its flag
    (or its key where it has none)."""
    records = {fl.name: s for fl, s in settings_of(cls)}
    out = {}
    for name, value in values.items():
        if name not in records:
            raise AdvisorError(f"{cls.__name__} has no setting {prefix(name)}")
        if value is not None:
            out[name] = records[name].given(value, f"{cls.__name__}: '{name}'")
    return out


def job_from_values(spec, hw: HardwareProfile, cluster: Cluster, values: dict[str, Any],
                    base: TrainingJob | None = None) -> TrainingJob:
    """The training job from given settings (given_settings) and the defaults that depend on the model and the
    hardware, or (``base``, a plan's job) the given settings over that job; the checks between settings name
    the flags."""
    v = given_settings(TrainingJob, values)
    if base is not None:
        v = {**{name: getattr(base, name) for name in TRAINING_FIELDS}, **v}
    seq = check_count(flag_or_key("seq_length"), v.get("seq_length", spec.seq_length), limits.MAX_SEQ_LENGTH)
    gbs = check_count(flag_or_key("global_batch_size"), v.get("global_batch_size", max(DEFAULT_BATCH_TOKENS // seq, 1)),
                      limits.MAX_GLOBAL_BATCH)
    if family_of_model(spec) is RECOMMENDATION:
        if seq != 1:
            raise AdvisorError(f"{flag_or_key('seq_length')} {seq}: {spec.name} is a recommendation model (one sample "
                               "per row)")
        if v.get("cuda_graphs") or v.get("moe_dropless") is False:
            raise AdvisorError(f"--cuda-graphs/--moe-token-drop: {spec.name} is a recommendation model; they are "
                               "transformer settings")
        if "global_batch_size" not in v:   # the published batch, rounded up to a multiple of the devices
            gbs = -(-(spec.global_batch_size or cluster.devices) // cluster.devices) * cluster.devices
    v.update(global_batch_size=gbs, seq_length=seq, dtype=check_dtype(hw, v.get("dtype") or default_dtype(hw)))
    arch = architecture_of(hw.device.architecture)
    if arch is not None and not arch.flash_attention:
        if v.get("attention") == "flash":
            raise AdvisorError(f"{flag_or_key('attention')} flash: fused attention does not run on the {hw.device.name} "
                               f"of profile '{hw.name}' ({arch.title}; FlashAttention needs NVIDIA Ampere or newer, "
                               "advisor/specs/architectures.py): use --attention math")
        v["attention"] = "math"      # the default where the device runs no fused kernel
    kernel = v.get("attention_kernel")
    if arch is not None and kernel is not None and v.get("attention") != "math" and kernel not in arch.attention_kernels:
        runs = ", ".join(arch.attention_kernels) or "no fused attention"
        raise AdvisorError(f"{flag_or_key('attention_kernel')} {kernel}: this attention kernel does not run on the "
                           f"{hw.device.name} of profile '{hw.name}' ({arch.title} runs {runs}; "
                           "advisor/specs/architectures.py)")
    job = _Defaults(v)
    check_job_relations(job, flag_or_key)
    moe = getattr(spec, "moe", None) is not None
    if not job.moe_dropless and not moe:
        raise AdvisorError(f"{flag_or_key('moe_dropless')}: {spec.name} has no mixture-of-experts layers")
    if job.cuda_graphs:
        check_cuda_graphs(job.cuda_graphs, job.framework, moe, job.moe_dropless, flag_or_key("cuda_graphs"))
    _grid_needs_tokens(job)
    out = TrainingJob(**v)
    record = out.framework_record
    if arch is not None and out.attention != "math" and out.kernel not in arch.attention_kernels:
        # the framework's default kernel does not run on this device: the framework's kernel that does stands for
        # it (Megatron-LM and PyTorch on Ascend call FlashAttentionScore through MindSpeed and torch_npu: npu)
        runnable = [k for k in record.attention_kernels if k in arch.attention_kernels]
        if runnable:
            out = replace(out, attention_kernel=runnable[0])
    if getattr(spec, "sliding_window", None) is not None and not record.sliding_window:
        raise AdvisorError(f"{flag_or_key('framework_release')} {record.release}: {record.title} {record.release} has no "
                           f"sliding-window attention, which {spec.name} uses (every {spec.sliding_window_every} "
                           f"layer(s), {spec.sliding_window} keys); releases {', '.join(_windowed(record))} have it")
    if arch is not None and out.recipe == "mxfp8" and not arch.block_scaled_fp8:
        raise AdvisorError(f"{flag_or_key('fp8_recipe')} mxfp8: block-scaled FP8 runs on NVIDIA Blackwell tensor cores, not "
                           f"on the {hw.device.name} of profile '{hw.name}' ({arch.title}; advisor/specs/architectures.py): "
                           "use --fp8-recipe tensorwise, delayed or blockwise")
    if out.recipe == "nvfp4" and (arch is None or not arch.fp4_per_fp8_peak):
        raise AdvisorError(f"{flag_or_key('fp8_recipe')} nvfp4: NVFP4 runs on NVIDIA Blackwell's FP4 tensor cores, not "
                           f"on the {hw.device.name} of profile '{hw.name}' "
                           f"({arch.title if arch else 'no device.architecture given'}; advisor/specs/architectures.py)")
    return out


def _windowed(record) -> list[str]:
    return [r for r in record.releases if for_release(record, r).sliding_window]


def _grid_needs_tokens(job) -> None:
    """The emissions are those of training a token budget: a grid intensity needs one."""
    if job.grid_gco2e_per_kwh is not None and job.train_tokens is None:
        raise AdvisorError(f"{flag_or_key('grid_gco2e_per_kwh')} prices the emissions of a token budget: give "
                           f"{flag_or_key('train_tokens')} too")


def site_values(train_tokens: Any, pue: Any, grid: Any) -> dict[str, Any]:
    """The token budget and the site's settings given (whatif's, for every point), checked."""
    v = given_settings(TrainingJob, {"train_tokens": train_tokens, "pue": pue, "grid_gco2e_per_kwh": grid})
    _grid_needs_tokens(_Defaults(v))
    return v


class _Defaults:
    """Given settings with the job's defaults behind them (for the checks between settings)."""

    def __init__(self, given: dict[str, Any]) -> None:
        self._given = given

    def __getattr__(self, name: str) -> Any:
        if name in self._given:
            return self._given[name]
        fl = TRAINING_FIELDS[name]
        return field_default(fl)


TRAINING_FIELDS = {fl.name: fl for fl in fields(TrainingJob)}


def flag_or_key(name: str) -> str:
    """A TrainingJob setting as messages name it: its flag, or training: 'key' where it has none."""
    s = TRAINING_FIELDS[name].metadata["setting"]
    return s.flag or f"training: '{name}'"
