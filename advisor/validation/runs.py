"""The calibration set (benchmarks/data/calibration_runs.yaml, a copy of shared/validation/) as
cost-model inputs: one CalibrationRun per measured run, with the source's own conventions.

Sources and how their runs are read (every choice a source does not state is named here):
* Megatron-Bridge performance tables (Megatron-Core with Transformer Engine): RMSNorm, SwiGLU,
  rotary, untied embeddings, no linear biases (gpt-oss: biases); fused (flash) attention, no
  dropout; the distributed optimizer (ZeRO-1) unless the FSDP column is set (Megatron-FSDP,
  ZeRO-3); sequence parallelism whenever tp > 1; interleaved 1F1B when VP > 1; the per-run
  recomputation, FP8 recipe and CUDA graphs of benchmarks/data/mbridge_settings.yaml.
* llm-foundry MPT tables (PyTorch FSDP through Composer): LayerNorm, GELU, biases, learned
  positions, tied embeddings (the run notes: published parameter counts match this layout
  exactly); FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2; activation checkpointing = full
  recomputation of every block. The attention kernel of each table (benchmark harness at
  llm-foundry b2a43a1 and 5e85bd6): attn_impl "triton" (flash-attn 1.x's Triton kernel) for the
  October 2023 tables, FlashAttention-2 (flash-attn 2.4.2) for the January 2024 large-scale H100
  table's 1b/3b/7b/70b rows (triton for 13b/30b). Gradients are reduced in fp32 under the DEFAULT
  mixed-precision mode and in bf16 under PURE (the table's MP Mode column; Composer's
  get_mixed_precision). FP8 rows: Transformer Engine te.Linear with DelayedScaling (Composer's
  default recipe).
* MindFormers (MindSpore on Ascend 910B): the parallel settings of the linked yaml (dp, tp, pp,
  micro-batches, sequence parallelism, the parallel optimizer = ZeRO-2, or ZeRO-1 with gradient accumulation
  (see _strategy), recomputation with its per-stage layer counts); flash attention and no dropout,
  except where the yaml says otherwise (MINDFORMERS_YAML_SETTINGS; uneven stages: MINDFORMERS_STAGE_LAYERS;
  fine_grain_interleave priced as tensor-parallel overlap over sequence slices, advisor.cost.layer_comm).
Runs are excluded, with the reason, when they are marked doubtful, when their published parallel
layout matches no performance preset of their release (fourteen Megatron-Bridge rows, each with the
disagreement and the preset in mbridge_settings.yaml's preset_conflicts), need a device without a
bundled profile, use NVFP4 (no FP4 GEMMs in the cost model) or CPU activation offload on GB200
(four FSDP rows: priced as activation swapping their memory comes out over the device, see _run;
the two GB300 offload rows fit its 279 GiB and are kept), or are implausible: a measured MFU below
a fifth of their source's median on the same device (_implausible).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from advisor.cost.layer_comm import FINE_GRAIN_SLICES
from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec, model_from_dict
from advisor import bundled_yaml

DATA_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
RUNS_FILE = DATA_DIR / "calibration_runs.yaml"
SETTINGS_FILE = DATA_DIR / "mbridge_settings.yaml"

# Hardware of the transcription -> bundled profile (None: no profile; those runs are excluded).
PROFILES = {
    "dgx-h100": "dgx-h100",
    "h100-80g-mosaicml": "dgx-h100",          # 8x H100 SXM 80GB nodes (run notes)
    "a100-80g-mosaicml": "dgx-a100-80g",      # 8x A100 SXM4 80GB, 200 Gb/s per GPU (README)
    "a100-40g-mosaicml": "dgx-a100-40g",
    "atlas-800t-a2": "ascend-910b",
    # built from Atlas 800T A2-class servers (run notes); MindFormers' v1.3.0 model cards measure four
    # yamls on both machines with the PoDc 12-20% faster per NPU and one 7% slower (docs/model_cards/
    # llama2.md, baichuan2.md, codellama.md, gpt2.md) and say nothing of why, so it shares the profile
    "atlas-900-a2-podc": "ascend-910b",
    "dgx-b200": "dgx-b200",
    "dgx-gb200": "gb200-nvl72",
    "dgx-b300": "dgx-b300",
    "dgx-gb300": "gb300-nvl72",
}
DEVICE_NAMES = {"dgx-h100": "H100", "dgx-a100-80g": "A100", "dgx-a100-40g": "A100", "ascend-910b": "910B",
                "dgx-b200": "B200", "gb200-nvl72": "GB200", "dgx-b300": "B300", "gb300-nvl72": "GB300"}
SOURCES = {"mbridge": "Megatron-Bridge", "foundry": "llm-foundry", "mindformers": "MindFormers"}
# A judgment, checked on the set: every other run measures at least 0.30 of its source-and-device
# median MFU (the lowest: GB300's one BF16 run, gpt-oss-120B, among FP8 rows whose MFU measured_mfu
# counts on the 16-bit peak, and MoE rows host-bound at micro-batch 1 such as B200's Qwen3-30B-A3B at
# 0.34); the one below is at 0.11 of it, so a fifth leaves a margin on both sides (tests/test_calibration.py
# names the only implausible run)
IMPLAUSIBLE_FRACTION = 1.0 / 5.0
# Megatron-Bridge rows whose published layout matches no preset of their release (mbridge_settings.yaml
# preset_conflicts): left out, as the set's own CONFLICT rows are, under this reason
PRESET_CONFLICT = "preset conflict"
FP8_RECIPES = {"fp8": None, "fp8_cs": "tensorwise", "mxfp8": "mxfp8", "fp8_blockwise": "blockwise",
               "nvfp4": "nvfp4"}     # NVFP4: Megatron-Bridge's bf16_with_nvfp4_mixed (advisor.cost.fp8)

# Architecture details the transcription keeps in free-text notes, per model name (values from
# those notes: DeepSeek-V2/V3 MLA ranks, gpt-oss head width, biases and alternating 128-token
# windows, Qwen3 head width, Qwen2 small models' tied embeddings, GPT-2's layout).
ARCHITECTURE: dict[str, dict[str, Any]] = {
    "DeepSeek-V3": {"mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                            "qk_rope_head_dim": 64, "v_head_dim": 128}},
    "DeepSeekV2-236B": {"mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                                "qk_rope_head_dim": 64, "v_head_dim": 128}},
    "gpt-oss-120b": {"head_dim": 64, "use_bias": True, "sliding_window": 128, "sliding_window_every": 2},
    "Qwen3-30B-A3B": {"head_dim": 128},
    "Qwen3-235B-A22B": {"head_dim": 128},
    "Qwen2-0.5B": {"tie_embeddings": True},
    "Qwen2-1.5B": {"tie_embeddings": True},
    "GPT2-13B": {"norm": "layernorm", "use_bias": True, "position_embedding": "learned", "tie_embeddings": True},
}
FAMILY = {
    "mbridge": {"norm": "rmsnorm", "use_bias": False, "position_embedding": "rotary", "tie_embeddings": False},
    "foundry": {"norm": "layernorm", "use_bias": True, "position_embedding": "learned", "tie_embeddings": True},
    "mindformers": {"norm": "rmsnorm", "use_bias": False, "position_embedding": "rotary", "tie_embeddings": False},
}
FRAMEWORK = {"mbridge": "megatron", "foundry": "pytorch", "mindformers": "mindspore"}
# MindFormers rows whose linked yaml (tag v1.3.0) turns flash attention off (use_flash_attention: False:
# the score matmul, softmax and context matmul run as separate operators, "math" attention) and, for
# GPT-2 13B, keeps dropout on (hidden_dropout_rate / attention_dropout_rate 0.1): configs/gpt2/run_gpt2_13b.yaml,
# configs/glm3/finetune_glm3_6b_bf16.yaml. Every other linked yaml has flash attention on and no dropout.
# Seven yamls pick an optimizer whose update runs one kernel per operation (advisor.cost.optimizer_step,
# "unfused"): MindFormers' AdamW (research/llama3_1/finetune_llama3_1_8b.yaml, configs/glm4/finetune_glm4_9b.yaml,
# research/qwen2/finetune_qwen2_{0.5b,1.5b}_32k.yaml, research/deepseek1_5/finetune_deepseek_coder1_5_7b.yaml)
# and Yi's AdamWeightDecayX (research/yi/finetune_yi_{6b,34b}.yaml, research/yi/optim.py); the others
# run FP32StateAdamWeightDecay or FusedAdamWeightDecay, the fused AdamWeightDecay primitive.
_UNFUSED_OPTIMIZER = {"optimizer_impl": "unfused"}
MINDFORMERS_YAML_SETTINGS: dict[str, dict[str, Any]] = {
    "mindformers-gpt2-13b-atlas-800t-a2": {"attention": "math", "dropout": True},
    "mindformers-glm3-6b-atlas-800t-a2": {"attention": "math"},
    **{f"mindformers-{name}": _UNFUSED_OPTIMIZER for name in (
        "llama3.1-8b-atlas-900-a2-podc", "glm4-9b-atlas-900-a2-podc", "qwen2-0.5b-atlas-900-a2-podc",
        "qwen2-1.5b-atlas-900-a2-podc", "deepseek-coder1.5-7b-atlas-900-a2-podc", "yi-6b-atlas-800t-a2",
        "yi-34b-atlas-800t-a2")},
}
# Pipeline rows whose yaml sets model_config.offset: MindFormers' LayerSetting (mindformers/models/utils.py
# at v1.3.0, used by the Llama and ChatGLM2 models) gives stage p num_layers // pp + offset[p] layers:
# GLM4-9B 40 layers, offset [-1, 0, 1, 0] (configs/glm4/finetune_glm4_9b.yaml); Yi-34B 60 layers,
# offset [-1, 1, 1, -1] (research/yi/finetune_yi_34b.yaml). The other pipeline rows' yamls leave it at 0.
MINDFORMERS_STAGE_LAYERS: dict[str, tuple[int, ...]] = {
    "mindformers-glm4-9b-atlas-900-a2-podc": (9, 10, 11, 10),
    "mindformers-yi-34b-atlas-800t-a2": (14, 16, 16, 14),
}
_MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
               "ffn_activation", "vocab_size", "moe")


@dataclass(frozen=True)
class CalibrationRun:
    """One measured run as the cost model sees it."""

    id: str
    source: str                      # Megatron-Bridge | llm-foundry | MindFormers
    profile: str | None              # bundled hardware profile
    devices: int
    model: ModelSpec
    job: TrainingJob
    strategy: Strategy
    measured_tokens_per_s_per_device: float
    features: frozenset[str] = field(default_factory=frozenset)
    excluded: str | None = None      # why the run is left out (printed by the benchmark)
    measured_peak_memory_gib: float | None = None     # where published (torchtitan: max reserved)
    hardware_overrides: tuple[tuple[str, float], ...] = ()   # device fields the run's machine differs in
    machine: str = ""                # the machine the source names ("atlas-900-a2-podc"), which PROFILES maps

    @property
    def group(self) -> str:
        """The unit errors are reported per: source on one device ('llm-foundry H100')."""
        return f"{self.source} {DEVICE_NAMES.get(self.profile or '', 'other')}"


@lru_cache(maxsize=1)
def _settings() -> dict[str, Any]:
    if not SETTINGS_FILE.is_file():
        return {}
    return yaml.safe_load(SETTINGS_FILE.read_text()) or {}


def _model(raw: dict[str, Any], kind: str, seq: int) -> ModelSpec:
    data = {k: raw[k] for k in _MODEL_KEYS if raw.get(k) is not None}
    data.update(FAMILY[kind])
    data.update(ARCHITECTURE.get(raw["name"], {}))
    data.update(name=raw["name"], source="calibration run", seq_length=seq)
    return model_from_dict(data, raw["name"])


def _recompute(text: str | None) -> tuple[str, int | tuple[int, ...] | None]:
    """'none' | 'full' | 'selective' | 'full recompute of [6, 3, 2, 3] layers per pipeline stage'."""
    if not text or text == "none":
        return "none", None
    counts = re.search(r"\[([\d,\s]+)\]", text)
    kind = "full" if text.startswith("full") else "selective"
    if counts is None:
        return kind, None
    per_stage = tuple(int(x) for x in counts.group(1).split(","))
    if not any(per_stage):
        return "none", None
    return kind, per_stage


def _strategy(run: dict[str, Any], kind: str, model: ModelSpec, settings: dict[str, Any]) -> Strategy:
    p, t = run["parallel"], run["training"]
    tp, pp, cp = p.get("tp") or 1, p.get("pp") or 1, p.get("cp") or 1
    dp = run["devices"] // (tp * pp * cp)
    mbs = t["mbs"]
    vpp = p.get("vpp") or 1
    if kind == "mbridge":
        zero = 3 if (p.get("fsdp") or 0) > 0 else 1
        recompute, layers = settings.get("recompute", "none"), settings.get("recompute_layers")
        sp = tp > 1
    elif kind == "foundry":
        zero = p["zero_stage"]
        recompute, layers = p.get("recompute", "none"), None
        sp = False
    else:
        # MindSpore's optimizer parallel slices the weights and both optimizer states over dp, all-gathers
        # each weight before its first use (kept through the backward: parallel_optimizer_comm_recompute
        # is off) and reduce-scatters the gradients (MindSpore optimizer_parallel.md, r2.4.0); with
        # gradient accumulation the accumulated gradients stay whole (gradient_accumulation_shard is
        # False in every MindFormers yaml). As memory and traffic: ZeRO-2, or ZeRO-1 under accumulation.
        micro = t["gbs"] // (dp * mbs)
        zero = (2 if micro == 1 else 1) if p.get("optimizer_parallel") else 0
        recompute, layers = _recompute(p.get("recompute"))
        sp = bool(p.get("sequence_parallel")) and tp > 1
    return Strategy(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=p.get("ep") or 1, sequence_parallel=sp, virtual_pipeline_stages=vpp,
        micro_batch_size=mbs, num_micro_batches=t["gbs"] // (dp * mbs), zero_stage=zero, recompute=recompute,
        recompute_layers=layers, pipeline_schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        stage_layers=(MINDFORMERS_STAGE_LAYERS.get(run["id"]) if kind == "mindformers"
                      else tuple(settings["stage_layers"]) if settings.get("stage_layers") else None),
        # Megatron-Core's cpu_offloading of the first N layers' activations (only without pipelining):
        # priced as activation swapping (advisor.cost.swap)
        swap_layers=(settings["activation_offload_layers"],) if settings.get("activation_offload_layers") else None,
        # the Megatron-Bridge MoE recipes' expert_tensor_parallel_size=1 (mbridge_settings.yaml fold_experts)
        fold_experts=bool(settings.get("fold_experts")),
    )


def _features(run: dict[str, Any], model: ModelSpec, job: TrainingJob, s: Strategy) -> frozenset[str]:
    out = set()
    if job.dtype == "fp8":
        out.add("FP8")
    if s.zero_stage == 3:
        out.add("FSDP/ZeRO-3")
    if s.cp > 1:
        out.add("context parallel")
    if model.moe is not None:
        out.add("MoE")
    if job.seq_length >= 16384:
        out.add("long context (>= 16k)")
    return frozenset(out)


def _foundry_job_settings(raw: dict[str, Any]) -> dict[str, Any]:
    large = raw["id"].startswith("foundry-h100-bf16-large-")
    flash2 = large and not any(f"-mpt-{size}-" in raw["id"] for size in ("13b", "30b"))
    # BACKWARD_POST prefetch (Composer's default) in the 2023 harness; the 2024 large-scale sweep set
    # BACKWARD_PRE (sweep.py @5e85bd6)
    return {"attention_kernel": "sdpa" if flash2 else "triton",
            "grad_reduce_dtype": "bf16" if raw["training"].get("mp_mode") == "PURE" else "fp32",
            "fsdp_backward_prefetch": "pre" if large else "post"}


def _job_settings(raw: dict[str, Any], kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """TrainingJob keyword arguments beyond the table's own columns."""
    if kind == "foundry":
        return _foundry_job_settings(raw)
    if kind == "mindformers":
        out = dict(MINDFORMERS_YAML_SETTINGS.get(raw["id"], {}))
        slices = raw["parallel"].get("fine_grain_interleave") or 1
        if slices > 1:   # sequence slices whose collectives overlap each other's compute (advisor.cost.layer_comm)
            if slices != FINE_GRAIN_SLICES:
                raise AdvisorError(f"{RUNS_FILE.name}: run {raw['id']!r}: fine_grain_interleave {slices} is not "
                                   f"the {FINE_GRAIN_SLICES} slices advisor prices")
            out["tp_comm_overlap"] = True
        return out
    if kind == "mbridge":
        base = dict(_settings().get("defaults", {}))
        base.update({k: settings[k] for k in ("tp_comm_overlap", "ep_comm_overlap", "overlap_grad_reduce", "moe_dropless")
                     if k in settings})
        if settings.get("selective_modules"):
            base["recompute_modules"] = tuple(settings["selective_modules"])
        graphs = _settings().get("cuda_graphs", {}).get(raw["id"])
        if graphs:
            base["cuda_graphs"] = tuple(graphs)
        # FP8 current-scaling and MXFP8 recipes keep FP8 primary weights (fp8_param_gather=True in
        # bf16_with_fp8_current_scaling_mixed / bf16_with_mxfp8_mixed); blockwise does not
        recipe = settings.get("fp8_recipe") or FP8_RECIPES.get(raw["training"]["dtype"])
        base["fp8_param_gather"] = recipe in ("tensorwise", "mxfp8")
        return base
    return {}


def _run(raw: dict[str, Any]) -> CalibrationRun:
    kind = raw["id"].split("-")[0]
    t = raw["training"]
    settings = _settings().get("runs", {}).get(raw["id"], {})
    model_raw = dict(raw["model"])
    if settings.get("mtp_layers"):   # DeepSeek-V3's MTP block: one more layer on the last stage
        model_raw["num_layers"] = model_raw["num_layers"] + settings["mtp_layers"]
    model = _model(model_raw, kind, t["seq"])
    dtype = t["dtype"]
    excluded = None
    conflict = _settings().get("preset_conflicts", {}).get(raw["id"]) if kind == "mbridge" else None
    if raw.get("doubtful"):
        excluded = f"doubtful: {raw.get('notes', 'marked doubtful in the calibration set')}"
    elif conflict:
        excluded = f"{PRESET_CONFLICT}: {conflict}"
    elif PROFILES.get(raw["hardware"]) is None:
        excluded = f"no bundled profile for {raw['hardware']}"
    elif (settings.get("activation_offload_layers") and PROFILES.get(raw["hardware"]) == "gb200-nvl72"
          and raw["model"]["num_layers"] == 80):
        # Priced as activation swapping (advisor.cost.swap) these rows come within -6% to 0% of the
        # measured throughput, but the Llama 3 70B FSDP preset's memory (40 of 80 layers offloaded) is
        # predicted at 195.5 GiB on the 186 GiB GB200 (judged not to fit, though it ran): its activations
        # are over-counted by at least 5%, and until that is found its three rows stay out. The 405B
        # preset on GB200 (95 of 126 layers offloaded, 121.7 GiB predicted) and GB300's 70B presets
        # (20 layers, 272 of 279 GiB) fit and stay in.
        excluded = (f"CPU activation offload of {settings['activation_offload_layers']} layers (Megatron's "
                    "cpu_offloading): priced as activation swapping, this 70B preset's memory comes out 5% over "
                    "the device (not yet explained)")
    recipe = settings.get("fp8_recipe") or FP8_RECIPES.get(dtype)
    job = TrainingJob(
        global_batch_size=t["gbs"], seq_length=t["seq"],
        dtype="fp8" if dtype in FP8_RECIPES else dtype,
        fp8_recipe=recipe if dtype in FP8_RECIPES else None,
        framework=FRAMEWORK[kind], **{"attention": "flash", "dropout": False, **_job_settings(raw, kind, settings)},
    )
    strategy = _strategy(raw, kind, model, settings)
    measured = raw["measured"].get("tokens_per_s_per_device")
    if measured is None:   # Megatron-Bridge's model TFLOP/s counts FLOPs as ModelSpec does (causal attention halved)
        measured = raw["measured"]["tflops_per_device"] * 1e12 / model.training_flops_per_token(t["seq"])
    return CalibrationRun(
        id=raw["id"], source=SOURCES[kind], profile=PROFILES.get(raw["hardware"]), devices=raw["devices"],
        model=model, job=job, strategy=strategy, measured_tokens_per_s_per_device=float(measured),
        features=_features(raw, model, job, strategy), excluded=excluded, machine=raw["hardware"],
    )


@lru_cache(maxsize=None)
def bundled_profile(name: str) -> HardwareProfile:
    """A bundled hardware profile, parsed once per process."""
    return load_hardware(name)


def model_flops_utilization(model: ModelSpec, seq_length: int, tokens_per_s_per_device: float, profile: str,
                            dtype: str) -> float:
    """Model FLOPs per second per device (ModelSpec.training_flops_per_token: causal attention halved,
    recomputation not counted) over the profile's peak for `dtype`. advisor's estimates use the
    job's dtype (the FP8 peak for FP8 runs); comparing runs of mixed precision, use the 16-bit one."""
    peak = bundled_profile(profile).device.peak_flops(dtype)
    return model.training_flops_per_token(seq_length) * tokens_per_s_per_device / peak


def measured_mfu(run: CalibrationRun) -> float:
    """The run's measured MFU on its compute dtype's (16-bit) peak, so that FP8 and BF16 runs of one
    source compare."""
    return model_flops_utilization(run.model, run.job.seq_length, run.measured_tokens_per_s_per_device,
                                   run.profile, run.job.compute_dtype)


def _implausible(runs: tuple[CalibrationRun, ...]) -> tuple[CalibrationRun, ...]:
    """Leave out runs whose measured MFU is below a fifth of their source's median on the same device
    (IMPLAUSIBLE_FRACTION): such a figure cannot come from the configuration the run names. On the
    calibration set this flags one run, MindFormers' DeepSeek-Coder-1.5-7B (340 tokens/s/NPU, MFU 0.04,
    against the same source's Llama-2-7B at 4,160 and a median MFU of 0.375 on 910B)."""
    groups: dict[str, list[float]] = {}
    mfu = {r.id: measured_mfu(r) for r in runs if r.excluded is None}
    for r in runs:
        if r.id in mfu:
            groups.setdefault(r.group, []).append(mfu[r.id])
    medians = {g: sorted(v)[len(v) // 2] for g, v in groups.items()}
    out = []
    for r in runs:
        if r.id in mfu and mfu[r.id] < IMPLAUSIBLE_FRACTION * medians[r.group]:
            r = replace(r, excluded=f"implausible: measured MFU {mfu[r.id]:.2f} is below a fifth of the "
                                    f"{r.group} median {medians[r.group]:.2f}")
        out.append(r)
    return tuple(out)


def _check_ids(ids: set[str]) -> None:
    """Every run the settings name is in the calibration set (a stale id would silently do nothing)."""
    named = {f"{SETTINGS_FILE.name} {key}": set(_settings().get(key, {}))
             for key in ("runs", "cuda_graphs", "preset_conflicts")}
    named["runs.py MINDFORMERS_YAML_SETTINGS"] = set(MINDFORMERS_YAML_SETTINGS)
    named["runs.py MINDFORMERS_STAGE_LAYERS"] = set(MINDFORMERS_STAGE_LAYERS)
    for where, names in named.items():
        for unknown in sorted(names - ids):
            raise AdvisorError(f"{where}: run {unknown!r} is not in {RUNS_FILE.name}")


@lru_cache(maxsize=1)
def load_runs() -> tuple[CalibrationRun, ...]:
    """Every run of the calibration set, in file order."""
    data = bundled_yaml.load(RUNS_FILE)
    _check_ids({r["id"] for r in data["runs"]})
    return _implausible(tuple(_run(r) for r in data["runs"]))
