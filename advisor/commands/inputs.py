"""Turn command-line values into specs: the model, the hardware, the cluster and the training job.

Shared by every command that takes --model/--hardware/--nodes|--devices/--gbs/--seq-len/--dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.job import (ATTENTION, CUDA_GRAPH_MODULES, FP8_RECIPES, FRAMEWORKS, Cluster, TrainingJob, check_cuda_graphs,
                               check_optimizer_impl, check_recompute_modules, parse_token_count)
from advisor.specs.model import ModelSpec, load_model
from advisor.specs.recommendation import RecModelSpec
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


def resolve_inputs(
    model: str,
    hardware: str | HardwareProfile,
    nodes: int | None = None,
    devices: int | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: str | None = None,
    tokens: str | float | None = None,
    attention: str = "flash",
    dropout: bool = False,
    framework: str = "megatron",
    fp8_recipe: str | None = None,
    recompute_modules: str | None = None,
    grid_intensity: str | None = None,
    pue: float | None = None,
    comm_priority: bool = False,
    cuda_graphs: str | None = None,
    token_drop: bool = False,
    optimizer_impl: str = "fused",
) -> Inputs:
    spec = load_model(model)
    if getattr(spec, "family", None) == "supernet":
        raise AdvisorError(f"{spec.name} is a supernet (family: supernet): advisor recommend and estimate plan it on "
                           "one hardware profile with NASPipe's schedule (--pp, --global-batch); other options do not apply")
    hw = hardware if isinstance(hardware, HardwareProfile) else load_hardware(hardware)
    cluster = Cluster.of(hw, nodes=nodes, devices=devices)
    seq = check_count("--seq-len", seq_len if seq_len is not None else spec.seq_length, limits.MAX_SEQ_LENGTH)
    gbs = check_count("--global-batch", global_batch if global_batch is not None else max(DEFAULT_BATCH_TOKENS // seq, 1),
                      limits.MAX_GLOBAL_BATCH)
    if isinstance(spec, RecModelSpec):
        if seq != 1:
            raise AdvisorError(f"--seq-len {seq}: {spec.name} is a recommendation model (one sample per row)")
        if cuda_graphs is not None or token_drop:
            raise AdvisorError(f"--cuda-graphs/--moe-token-drop: {spec.name} is a recommendation model; they are "
                               "transformer settings")
        if global_batch is None:   # the published batch, rounded up to a multiple of the devices
            gbs = -(-(spec.global_batch_size or cluster.devices) // cluster.devices) * cluster.devices
    dt = check_dtype(hw, dtype or default_dtype(hw))
    if attention not in ATTENTION:
        raise AdvisorError(f"--attention must be one of {', '.join(ATTENTION)}, got {prefix(attention)}")
    if framework not in FRAMEWORKS:
        raise AdvisorError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {prefix(framework)}")
    if fp8_recipe is not None and (dt != "fp8" or fp8_recipe not in FP8_RECIPES):
        raise AdvisorError(f"--fp8-recipe must be one of {', '.join(FP8_RECIPES)} and goes with --dtype fp8 "
                           f"(got --fp8-recipe {prefix(fp8_recipe)} with --dtype {dt})")
    check_optimizer_impl(optimizer_impl, framework, "--optimizer-impl")
    train_tokens = parse_token_count(tokens) if isinstance(tokens, str) else tokens
    modules = None
    if recompute_modules is not None:
        modules = tuple(m.strip() for m in recompute_modules.split(",") if m.strip())
        check_recompute_modules(modules, framework, "--recompute-modules")
    return Inputs(spec, hw, cluster, TrainingJob(global_batch_size=gbs, seq_length=seq, dtype=dt, train_tokens=train_tokens,
                                                  attention=attention, dropout=dropout, framework=framework,
                                                  fp8_recipe=fp8_recipe, recompute_modules=modules,
                                                  comm_priority=comm_priority, optimizer_impl=optimizer_impl,
                                                  **graph_settings(spec, framework, cuda_graphs, token_drop),
                                                  **site_settings(grid_intensity, pue, train_tokens)))


def graph_settings(spec, framework: str, cuda_graphs: str | None, token_drop: bool, dropless: bool = True) -> dict:
    """TrainingJob's moe_dropless and cuda_graphs from --moe-token-drop and --cuda-graphs (on a
    model's own settings: ``dropless``, and its graphs where --cuda-graphs is not given)."""
    moe = getattr(spec, "moe", None) is not None
    if token_drop and not moe:
        raise AdvisorError(f"--moe-token-drop: {spec.name} has no mixture-of-experts layers")
    out: dict = {"moe_dropless": dropless and not token_drop}
    if cuda_graphs is not None:
        out["cuda_graphs"] = parse_cuda_graphs(cuda_graphs, framework, moe, out["moe_dropless"])
    return out


def parse_cuda_graphs(text: str | None, framework: str, moe: bool, dropless: bool = True) -> tuple[str, ...]:
    """--cuda-graphs attn,moe_router -> ('attn', 'moe_router'); checked as Megatron-Core checks it
    (dropless MoE, the default, cannot graph whole MoE layers)."""
    if text is None:
        return ()
    graphs = tuple(m.strip() for m in text.split(",") if m.strip())
    if not graphs:
        raise AdvisorError(f"--cuda-graphs needs at least one module ({', '.join(CUDA_GRAPH_MODULES)})")
    check_cuda_graphs(graphs, framework, moe, dropless, "--cuda-graphs")
    return graphs


def site_settings(grid_intensity: str | None, pue: float | None, train_tokens: float | None) -> dict:
    """TrainingJob's pue and grid_gco2e_per_kwh from --pue and --grid-intensity (advisor.cost.carbon);
    emissions are those of training a token budget, so the grid needs --tokens."""
    from advisor.cost.carbon import DEFAULT_PUE, check_pue, grid_intensity as parse_grid

    grid = parse_grid(grid_intensity)
    if grid is not None and train_tokens is None:
        raise AdvisorError("--grid-intensity prices the emissions of a token budget: give --tokens too")
    return {"pue": DEFAULT_PUE if pue is None else check_pue(pue), "grid_gco2e_per_kwh": grid}
