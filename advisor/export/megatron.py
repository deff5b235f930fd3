"""Megatron-LM: a launch script running ``pretrain_gpt.py`` under torchrun with the plan's flags.

Flag names, choices and the checks they must pass follow megatron/training/arguments.py of
NVIDIA/Megatron-LM (``_add_distributed_args``, ``_add_training_args``, ``_add_network_size_args``,
``_add_moe_args``, ``_add_mixed_precision_args``, ``validate_args``); the custom pipeline layout
string follows megatron/core/transformer/pipeline_parallel_layer_layout.py ("E|t*n|...|L": E the
embedding, t a transformer layer, L the loss, stages split by '|', virtual stages in the order
vpp_rank * pp + pp_rank). ZeRO-2/3 use Megatron FSDP (Megatron-Core developer guide, "Megatron FSDP":
--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads[_params]
--no-gradient-accumulation-fusion --use-distributed-optimizer, checkpoint format fsdp_dtensor).

Target releases (--target-version, VERSIONS below), each checked flag by flag in that release's
megatron/training/arguments.py (tags core_v0.13.0, core_v0.14.0, core_v0.15.0 of NVIDIA/Megatron-LM):
--pipeline-model-parallel-layout first appears in 0.13; --use-megatron-fsdp with the fsdp_dtensor
checkpoint format in 0.14 (0.13 has only the older --use-custom-fsdp, without fsdp_dtensor), so
ZeRO-2/3 plans need 0.14 or newer. The container each release's README names is
nvcr.io/nvidia/pytorch:25.04-py3 for all three (README.md "Docker" section at each tag).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from advisor.errors import AdvisorError
from advisor.export import ExportResult
from advisor.export import _comm_knobs, _settings
from advisor.export._common import (
    chunk_layers, comment_block, header_lines, is_even_split, mesh_text, pick_version, procs_per_node, stage_layers,
    train_steps, unwritten_model_features,
)
from advisor.export._recompute import CORE_ATTENTION, FULL, MINDSPORE_SELECT, NONE, OP_LEVEL, cannot_express, priced_recompute
from advisor.plan import Plan

SCRIPT = "pretrain_gpt.py"
# Megatron's rank orders, outermost to innermost, over advisor's mesh dimensions:
# default "tp-cp-ep-dp-pp", and "tp-cp-ep-pp-dp" with --use-tp-pp-dp-mapping.
DEFAULT_ORDER = ("pp", "dp", "cp", "tp")
TP_PP_DP_ORDER = ("dp", "pp", "cp", "tp")



@dataclass(frozen=True)
class MegatronRelease:
    """What one Megatron-Core release accepts, as far as the export uses it."""

    git_tag: str                  # the NVIDIA/Megatron-LM tag of the release
    megatron_fsdp: bool           # --use-megatron-fsdp and --ckpt-format fsdp_dtensor (ZeRO-2/3)
    container: str                # the NGC PyTorch container its README names
    window_attention: bool = False  # --window-size and --window-attn-skip-freq (arguments.py, core_v0.15.0 on)


# ModelSpec and Strategy values as Megatron-LM's flags take them (arguments.py, core_v0.13-0.15); the importer
# (advisor.importers.megatron_args) reads them back through the same tables
POSITION_EMBEDDINGS = {"rotary": "rope", "learned": "learned_absolute", "none": "none"}
NORMALIZATIONS = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
SHARDING_STRATEGIES = {0: "no_shard", 1: "optim", 2: "optim_grads", 3: "optim_grads_params"}   # Megatron FSDP
FRAMEWORK = "megatron"   # the framework record this export launches (the flags run Megatron-LM)
VERSIONS = {
    "0.13": MegatronRelease("core_v0.13.0", False, "nvcr.io/nvidia/pytorch:25.04-py3"),
    "0.14": MegatronRelease("core_v0.14.0", True, "nvcr.io/nvidia/pytorch:25.04-py3"),
    "0.15": MegatronRelease("core_v0.15.0", True, "nvcr.io/nvidia/pytorch:25.04-py3", window_attention=True),
}
DEFAULT_VERSION = "0.15"
GROUPS = ("PARALLEL_ARGS", "MODEL_ARGS", "TRAINING_ARGS", "OPTIMIZER_ARGS", "DATA_ARGS", "LOGGING_ARGS")


@dataclass
class MegatronLaunch:
    """The torchrun arguments, pretrain_gpt.py's arguments by group, and environment variables."""

    nnodes: int
    nproc_per_node: int
    version: str = DEFAULT_VERSION
    groups: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        """pretrain_gpt.py's arguments, in group order."""
        return [a for g in GROUPS for a in self.groups.get(g, [])]


def _active(order: tuple[str, ...], plan: Plan) -> list[str]:
    return [d for d in order if plan.strategy.degree(d) > 1]


def pipeline_layout(plan: Plan) -> str:
    """Megatron's --pipeline-model-parallel-layout for the plan's stage layers (and virtual stages)."""
    chunks = chunk_layers(plan)
    pp = plan.strategy.pp
    parts = []
    for v, row in enumerate(chunks):
        for p in range(pp):
            body = f"t*{row[p]}" if row[p] > 1 else "t" * row[p]      # a chunk may hold only E or L
            if v == 0 and p == 0:
                body = "E" + body
            if v == len(chunks) - 1 and p == pp - 1:
                body = body + "L"
            parts.append(body)
    return "|".join(parts)


def architecture_flags(plan: Plan) -> list[str]:
    """The model's MLA, shared experts and sliding-window attention as pretrain_gpt.py flags (arguments.py,
    core_v0.13-0.15: --multi-latent-attention with its ranks and head widths, --moe-shared-expert-intermediate-size
    (all shared experts together); core_v0.15 --window-size (left, right) and --window-attn-skip-freq, as
    Megatron-Bridge's GPTOSSProvider sets them: window_size (128, 0), skip frequency 2)."""
    m = plan.model
    out: list[str] = []
    if m.mla is not None:
        a = m.mla
        out.append("--multi-latent-attention")
        if a.q_lora_rank:
            out += ["--q-lora-rank", str(a.q_lora_rank)]
        out += ["--kv-lora-rank", str(a.kv_lora_rank), "--qk-head-dim", str(a.qk_nope_head_dim),
                "--qk-pos-emb-head-dim", str(a.qk_rope_head_dim), "--v-head-dim", str(a.v_head_dim)]
    if m.moe is not None and m.moe.num_shared_experts:
        out += ["--moe-shared-expert-intermediate-size", str(m.moe.shared_ffn)]
    if m.sliding_window is not None:
        out += ["--window-size", f"{m.sliding_window},0"]
        if m.sliding_window_every > 1:
            out += ["--window-attn-skip-freq", window_pattern(plan)]
    return out


def window_pattern(plan: Plan) -> str:
    """--window-attn-skip-freq as a list pattern (1: a windowed layer): one windowed layer in every
    sliding_window_every, the first of each group (gpt-oss alternates from a windowed layer 0)."""
    m = plan.model
    k = m.sliding_window_every
    if m.num_layers % k == 0:
        return f"([1]+[0]*{k - 1})*{m.num_layers // k}"
    return "[" + ",".join("1" if i % k == 0 else "0" for i in range(m.num_layers)) + "]"


def moe_layer_freq(plan: Plan) -> str:
    """--moe-layer-freq: an integer N puts an MoE layer at indices 0, N, 2N...; advisor's convention
    (ModelSpec.is_moe_layer) puts it last in each group of N, so give Megatron the explicit pattern, as for
    leading dense layers (DeepSeek's first_k_dense_replace)."""
    m = plan.model
    freq = m.moe.layer_frequency
    if m.moe.first_k_dense_layers:
        k = m.moe.first_k_dense_layers
        if freq == 1:
            return f"([0]*{k}+[1]*{m.num_layers - k})"
        return "[" + ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers)) + "]"
    if freq == 1:
        return "1"
    pattern = [1 if m.is_moe_layer(i) else 0 for i in range(m.num_layers)]
    if m.num_layers % freq == 0:
        return f"([0]*{freq - 1}+[1])*{m.num_layers // freq}"
    return "[" + ",".join(str(x) for x in pattern) + "]"


def megatron_launch(plan: Plan, target_version: str | None = None) -> MegatronLaunch:
    s, m, j = plan.strategy, plan.model, plan.training
    version = pick_version("megatron", target_version, tuple(VERSIONS), DEFAULT_VERSION)
    unsupported: list[str] = []
    notes: list[str] = []
    nproc = procs_per_node(plan, "torchrun", unsupported)
    launch = MegatronLaunch(nnodes=plan.cluster.nodes, nproc_per_node=nproc, version=version, unsupported=unsupported,
                            notes=notes)

    # ---- parallelism ---------------------------------------------------------------------------
    par = ["--tensor-model-parallel-size", str(s.tp), "--pipeline-model-parallel-size", str(s.pp),
           "--context-parallel-size", str(s.cp)]
    if s.cp > 1 and s.cp_comm != "p2p":
        par += ["--cp-comm-type", s.cp_comm]
    if s.sequence_parallel:
        par.append("--sequence-parallel")
    elif j.tp_comm_overlap and s.tp > 1:       # --tp-comm-overlap itself: the setting's record (_settings)
        unsupported.append("training.tp_comm_overlap = true without sequence parallelism: Megatron-LM overlaps "
                           "tensor-parallel communication only with --sequence-parallel")
    if m.moe is not None:
        par += ["--expert-model-parallel-size", str(s.ep)]
    if s.pp > 1:
        even = is_even_split(plan)
        if not even:
            par += ["--pipeline-model-parallel-layout", pipeline_layout(plan)]
            notes.append(f"uneven pipeline stages {list(stage_layers(plan))} use --pipeline-model-parallel-layout "
                         "(Megatron-Core 0.13 or newer)")
        elif s.virtual_pipeline_stages > 1:
            par += ["--num-layers-per-virtual-pipeline-stage", str(m.num_layers // (s.pp * s.virtual_pipeline_stages))]
        if s.pipeline_schedule == "gpipe":
            unsupported.append("parallel.pipeline_schedule = gpipe: Megatron-LM has no GPipe schedule; it runs 1F1B "
                               "(same bubble, less activation memory than the plan assumes)")
    zero_flags, fsdp = _zero_flags(plan, unsupported, version)
    par += zero_flags + _comm_knobs.megatron_flags(plan)     # communication fusion's bucket size
    unsupported.extend(x for x in [_comm_knobs.copies_unsupported(plan, "Megatron-LM", "--tp-comm-overlap"),
                                   _comm_knobs.priority_unsupported(plan, "Megatron-LM"),
                                   _comm_knobs.full_batch_unsupported(plan, "Megatron-LM"),
                                   _comm_knobs.host_embedding_unsupported(plan, "Megatron-LM")] if x)
    active = _active(s.mesh_order, plan)
    if active == _active(TP_PP_DP_ORDER, plan) and active != _active(DEFAULT_ORDER, plan):
        par.append("--use-tp-pp-dp-mapping")
    elif active != _active(DEFAULT_ORDER, plan):
        unsupported.append(f"parallel.mesh_order = {mesh_text(plan)}: Megatron-LM orders ranks tp-cp-ep-dp-pp "
                           "(or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping); exported with the default order")
    launch.groups["PARALLEL_ARGS"] = par
    if (s.tp > 1 or s.cp > 1) and not fsdp:
        # validate_args: TP or CP on pre-Blackwell GPUs requires CUDA_DEVICE_MAX_CONNECTIONS=1.
        launch.env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"

    # ---- model shape -----------------------------------------------------------------------------
    model = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
             "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads)]
    if m.num_kv_heads != m.num_attention_heads:
        model += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.head_dim_override is not None:
        model += ["--kv-channels", str(m.head_dim)]
    model += architecture_flags(plan)
    written = ("head_dim", "mla", "moe.num_shared_experts", "moe.first_k_dense_layers") + (
        ("sliding_window",) if VERSIONS[version].window_attention else ())
    unsupported += unwritten_model_features(plan, f"Megatron-LM {version}", written=written)
    model += ["--seq-length", str(j.seq_length), "--max-position-embeddings", str(max(j.seq_length, m.seq_length))]
    model += ["--position-embedding-type", POSITION_EMBEDDINGS[m.position_embedding]]
    model += ["--normalization", NORMALIZATIONS[m.norm]]
    if m.ffn_activation == "swiglu":
        model.append("--swiglu")
    if not m.tie_embeddings:
        model.append("--untie-embeddings-and-output-weights")
    if not m.use_bias:
        model.append("--disable-bias-linear")
    model += ["--attention-backend", "flash" if j.attention == "flash" else "unfused"]
    # Megatron-LM's dropout defaults are 0.1 / 0.1 (arguments.py): what a plan priced with dropout
    # runs; a plan priced without it (the default) turns both off
    if not j.dropout:
        model += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if m.moe is not None:
        model += ["--num-experts", str(m.moe.num_experts), "--moe-router-topk", str(m.moe.top_k),
                  "--moe-ffn-hidden-size", str(m.moe.expert_ffn_hidden_size), "--moe-layer-freq", moe_layer_freq(plan),
                  "--moe-token-dispatcher-type", "alltoall" if s.ep > 1 else "allgather"]
        if s.recompute == "selective" and "moe_act" in j.selective_modules:
            # Megatron-Core recomputes the experts' activation only inside grouped GEMMs
            model.append("--moe-grouped-gemm")
            notes.append("--moe-grouped-gemm (needed by --recompute-modules moe_act): the plan priced the experts' "
                         "GEMMs one by one, so expect them somewhat faster")
        if not j.moe_dropless:
            # priced without the dropless host synchronization: a capacity factor with padding
            model += ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]
    launch.groups["MODEL_ARGS"] = model

    # ---- batch, precision, recomputation -----------------------------------------------------------
    train = ["--micro-batch-size", str(s.micro_batch_size), "--global-batch-size", str(j.global_batch_size)]
    steps = train_steps(plan)
    if steps is None:
        train += ["--train-iters", "1000"]
        notes.append("the plan has no token budget: --train-iters 1000 is a placeholder")
    else:
        train += ["--train-iters", str(steps)]
    if j.dtype == "bf16":
        train.append("--bf16")
    elif j.dtype == "fp16":
        train.append("--fp16")
    elif j.recipe == "nvfp4":
        # NVFP4 replaces FP8 (Megatron-Core 0.15 refuses --fp4-format with --fp8-format; Megatron-Bridge's
        # bf16_with_nvfp4_mixed)
        train += ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    elif j.dtype == "fp8":
        # MXFP8 is E4M3 throughout (Megatron-Bridge's bf16_with_mxfp8_mixed); the per-tensor recipes
        # use the hybrid format (E4M3 forward, E5M2 gradients)
        train += ["--bf16", "--fp8-format", "e4m3" if j.recipe == "mxfp8" else "hybrid", "--fp8-recipe", j.recipe]
    train += _settings.flags(plan, "megatron", unsupported)   # the settings whose records spell them
    if j.dtype == "tf32":
        notes.append("training.dtype = tf32: Megatron-LM trains in fp32; TF32 matmuls follow PyTorch's "
                     "torch.backends.cuda.matmul.allow_tf32 setting")
    train += _recompute_flags(plan, unsupported)
    train += _cuda_graph_flags(plan, version, unsupported)
    launch.groups["TRAINING_ARGS"] = train

    opt = ["--optimizer", "sgd" if j.optimizer == "sgd" else "adam",
           "--lr", "3.0e-4", "--min-lr", "3.0e-5", "--lr-decay-style", "cosine", "--weight-decay", "0.1",
           "--clip-grad", "1.0"]
    if j.optimizer == "adam":
        notes.append("training.optimizer = adam: Megatron-LM's adam is AdamW (decoupled weight decay); "
                     "set --weight-decay 0 for plain Adam")
    if s.offload_params:
        unsupported.append("parallel.offload_params = true: Megatron-LM has no ZeRO-3 parameter offload (its "
                           "cpu_offloading moves activations and weights per layer and refuses pipelining); exported "
                           "with the optimizer offloaded only")
    if s.offload_optimizer:
        # validate_args: optimizer CPU offload needs the precision-aware optimizer.
        opt += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{s.offload_fraction:g}",
                "--use-precision-aware-optimizer"]
    launch.groups["OPTIMIZER_ARGS"] = opt
    notes.append("learning-rate flags in OPTIMIZER_ARGS are placeholders: the plan does not choose hyper-parameters")

    launch.groups["DATA_ARGS"] = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(m.vocab_size)]
    if j.attention == "flash":
        # fused attention takes no mask: do not build the s x s one per sample (advisor.cost.dataset
        # prices the samples without it; Megatron builds it unless told not to)
        launch.groups["DATA_ARGS"].append("--no-create-attention-mask-in-dataloader")
    notes.append("DATA_ARGS trains on mock data: replace with --data-path, --split and your tokenizer")
    launch.groups["LOGGING_ARGS"] = ["--log-interval", "10", "--log-throughput", "--eval-iters", "0"]
    return launch


def _zero_flags(plan: Plan, unsupported: list[str], version: str) -> tuple[list[str], bool]:
    s = plan.strategy
    if s.zero_stage == 0:
        return ["--overlap-grad-reduce"], False
    if s.zero_stage == 1:
        return ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"], False
    if not VERSIONS[version].megatron_fsdp:
        newer = " or ".join(v for v, r in VERSIONS.items() if r.megatron_fsdp)
        raise AdvisorError(f"parallel.zero_stage = {s.zero_stage}: Megatron-LM shards gradients through Megatron FSDP "
                           f"(--use-megatron-fsdp), which Megatron-Core {version} does not have; export with "
                           f"--target-version {newer}")
    strategy = SHARDING_STRATEGIES[s.zero_stage]
    if s.pp > 1:
        unsupported.append(
            f"parallel.zero_stage = {s.zero_stage} with pp = {s.pp}: Megatron-LM shards gradients (and parameters) only "
            "through Megatron FSDP, which is documented with TP, CP and EP but not with pipeline parallelism")
    return ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, "--no-gradient-accumulation-fusion",
            "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor", "--overlap-grad-reduce",
            "--overlap-param-gather"], True


def _cuda_graph_flags(plan: Plan, version: str, unsupported: list[str]) -> list[str]:
    """training.cuda_graphs (advisor.cost.cuda_graphs) as the target release's flags (arguments.py and
    transformer_config.py at core_v0.13.0 to core_v0.15.0): --cuda-graph-scope takes full or attn
    (Transformer Engine's implementation: --cuda-graph-impl transformer_engine from 0.15,
    --external-cuda-graph before, which 0.13 runs only with --te-rng-tracker) and, from 0.14,
    full_iteration (the local implementation: --cuda-graph-impl local, --enable-cuda-graph before
    0.15; validate_args wants --no-check-for-nan-in-loss-and-grad with it). With recomputation: the
    local implementation refuses it in every one of them; 0.13 and 0.14 do not check Transformer
    Engine graphs against it; 0.15 takes only a Transformer Engine attn graph beside selective
    recomputation of modules other than core_attn and mla_up_proj."""
    graphs, s = plan.training.cuda_graphs, plan.strategy
    if not graphs:
        return []
    newest = version not in ("0.13", "0.14")
    rc = priced_recompute(plan).kind
    te_graphs = graphs in (("full",), ("attn",))
    if newest:
        accepted = (graphs == ("attn",) and rc == CORE_ATTENTION
                    and not {"core_attn", "mla_up_proj"} & set(plan.training.selective_modules))
    else:
        accepted = te_graphs
    if s.recompute != "none" and not accepted:
        unsupported.append(f"training.cuda_graphs = {', '.join(graphs)} with parallel.recompute = {s.recompute}: "
                           f"Megatron-Core {version} refuses CUDA graphs with this recomputation; exported without "
                           "CUDA graphs")
        return []
    if te_graphs:
        impl = ["--cuda-graph-impl", "transformer_engine"] if newest else ["--external-cuda-graph"]
        return impl + ["--cuda-graph-scope", graphs[0], "--te-rng-tracker"]
    if graphs == ("full_iteration",) and version != "0.13":
        impl = ["--cuda-graph-impl", "local"] if newest else ["--enable-cuda-graph"]
        return impl + ["--cuda-graph-scope", "full_iteration", "--no-check-for-nan-in-loss-and-grad", "--te-rng-tracker"]
    unsupported.append(f"training.cuda_graphs = {', '.join(graphs)}: Megatron-Core {version}'s --cuda-graph-scope "
                       f"takes {'full or attn' if version == '0.13' else 'full, attn or full_iteration'} only (the mlp "
                       "and moe scopes are in later Megatron-Core releases); exported without CUDA graphs")
    return []


def _recompute_flags(plan: Plan, unsupported: list[str]) -> list[str]:
    """The priced recomputation (advisor.export._recompute) as Megatron-LM flags, or none."""
    s = plan.strategy
    priced = priced_recompute(plan)
    if priced.kind == NONE:
        return []
    if priced.kind == CORE_ATTENTION and priced.layers is None:
        return ["--recompute-granularity", "selective", "--recompute-modules", *priced.modules]
    if priced.kind == FULL and priced.layers is None:
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if priced.kind == FULL and isinstance(priced.layers, int) and priced.layers % s.virtual_pipeline_stages == 0:
        # block: recompute this many layers of each pipeline stage (per model chunk when interleaved)
        per_chunk = priced.layers // s.virtual_pipeline_stages
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(per_chunk)]
    closest = {FULL: "--recompute-method block with one count for every stage (a multiple of the virtual stages)",
               OP_LEVEL: "--recompute-granularity selective with --recompute-modules",
               MINDSPORE_SELECT: "--recompute-modules mlp"}.get(priced.kind, "")
    unsupported.append(cannot_express("Megatron-LM", priced, closest))
    return []


_ENV_DEFAULT = re.compile(r"\$\{[A-Z_]+:-[A-Za-z0-9._-]*\}")


def _bash_array(name: str, args: list[str]) -> str:
    """One flag per line with its values (a flag may take several, as --recompute-modules), every value
    quoted for bash."""
    def quoted(value: str) -> str:
        # let bash expand the launcher's own ${VAR:-default} (a fixed pattern); quote everything else
        return f'"{value}"' if _ENV_DEFAULT.fullmatch(value) else shlex.quote(value)

    lines, i = [], 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        lines.append("    " + " ".join([shlex.quote(args[i])] + [quoted(v) for v in args[i + 1:j]]))
        i = j
    return f"{name}=(\n" + "\n".join(lines) + "\n)\n"


def render_script(plan: Plan, launch: MegatronLaunch) -> str:
    release = VERSIONS[launch.version]
    out = ["#!/usr/bin/env bash\n",
           comment_block(header_lines(plan, f"Megatron-LM pretrain_gpt.py (Megatron-Core {launch.version}, "
                                            f"tag {release.git_tag})")),
           "# Run on every node (NODE_RANK 0..NNODES-1), with MASTER_ADDR set to node 0.\n",
           "set -euo pipefail\n", 'MEGATRON_LM="${MEGATRON_LM:-/workspace/Megatron-LM}"\n']
    for key, value in launch.env.items():
        out.append(f"export {key}={shlex.quote(value)}\n")
    out.append("\n")
    out.append(_bash_array("DISTRIBUTED_ARGS", [
        "--nnodes", str(launch.nnodes), "--nproc-per-node", str(launch.nproc_per_node),
        "--node-rank", "${NODE_RANK:-0}", "--master-addr", "${MASTER_ADDR:-localhost}",
        "--master-port", "${MASTER_PORT:-6000}",
        ]))
    comments = {
        "OPTIMIZER_ARGS": "# hyper-parameters below are placeholders (not part of the plan)\n",
        "DATA_ARGS": "# mock data: replace with --data-path PREFIX --split 949,50,1 and your tokenizer\n",
    }
    for group in GROUPS:
        out.append(comments.get(group, ""))
        out.append(_bash_array(group, launch.groups.get(group, [])))
    out.append('\ntorchrun "${DISTRIBUTED_ARGS[@]}" "${MEGATRON_LM}/' + SCRIPT + '" \\\n')
    out.append(" \\\n".join(f'    "${{{g}[@]}}"' for g in GROUPS) + "\n")
    return "".join(out)


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    launch = megatron_launch(plan, target_version)
    return ExportResult(target="megatron", files={"megatron_pretrain_gpt.sh": render_script(plan, launch)},
                        unsupported=tuple(launch.unsupported), notes=tuple(launch.notes))
