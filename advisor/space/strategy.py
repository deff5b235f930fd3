"""Strategy: every parallel degree and knob of one candidate, and StrategyBatch, many as arrays.

Conventions (Megatron-LM): the device count is dp * tp * pp * cp; expert parallelism ``ep`` is carved
out of the dp x cp ranks and divides dp * cp; the global batch is dp * micro_batch_size *
num_micro_batches. ``mesh_order`` lists the mesh dimensions from outermost to innermost: the last one
gets consecutive ranks (the fastest links). ``stage_layers`` counts transformer layers per physical
pipeline stage (each stage holds virtual_pipeline_stages chunks of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits
from advisor.specs.setting import setting
from advisor.specs.untrusted import prefix

RECOMPUTE = ("none", "selective", "full")
# Context-parallel communication, named as Megatron-Core's --cp-comm-type: p2p = ring attention (K/V
# blocks passed around the ring, overlapped with attention; Liu et al. 2023), a2a = Ulysses
# (all-to-alls that trade the sequence split for a head split; Jacobs et al. 2023, DeepSpeed-Ulysses).
CP_COMM = ("p2p", "a2a")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
# The indices StrategyBatch stores for them
RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = range(len(RECOMPUTE))
GPIPE, ONE_F_ONE_B, INTERLEAVED = range(len(SCHEDULES))
MESH_DIMS = ("pp", "dp", "cp", "tp")
DEFAULT_MESH_ORDER = ("pp", "dp", "cp", "tp")


def _recompute_layers(data: dict[str, Any], key: str, origin: str):
    rl = data.get(key)
    if isinstance(rl, list):
        if not rl or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in rl):
            raise AdvisorError(f"{origin}: key 'recompute_layers' must be a positive integer or a list of non-negative "
                               f"integers (one per pipeline stage), got {prefix(rl)}")
        return tuple(rl)
    return None if rl is None else f.positive_int(data, key, origin)


def _stage_layers(data: dict[str, Any], key: str, origin: str):
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value):
        raise AdvisorError(f"{origin}: key 'stage_layers' must be a list of positive integers, got {prefix(value)}")
    return tuple(value)


def _counts(text: str, flag: str, low: int) -> tuple[int, ...]:
    """A comma-separated list of layer counts given on the command line ("15,16,16,15"), each at least ``low``."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) > limits.MAX_LAYERS or not all(p.isdigit() and low <= int(p) <= limits.MAX_LAYERS for p in parts):
        raise AdvisorError(f"{flag}: expected layer counts of at least {low} separated by commas (each at most "
                           f"{limits.MAX_LAYERS}), got {prefix(str(text))}")
    return tuple(int(p) for p in parts)


def _recompute_counts(text: str) -> int | tuple[int, ...]:
    """--recompute-layers "4" (every stage) or "8,6" (one per stage, MindFormers' lists) as the setting holds it."""
    counts = _counts(text, "--recompute-layers", 0)
    if len(counts) == 1 and counts[0] < 1:
        raise AdvisorError(f"--recompute-layers: one count for every stage must be positive, got {counts[0]}")
    return counts[0] if len(counts) == 1 else counts


def _mesh_order(data: dict[str, Any], key: str, origin: str):
    mesh = data.get(key, list(MESH_DIMS))
    if not isinstance(mesh, list) or not all(isinstance(x, str) for x in mesh) or sorted(mesh) != sorted(MESH_DIMS):
        raise AdvisorError(f"{origin}: key 'mesh_order' must list each of {', '.join(MESH_DIMS)} once, got {prefix(mesh)}")
    return tuple(mesh)


def _swap_layers(data: dict[str, Any], key: str, origin: str):
    value = data.get(key)
    if value is None:
        return None
    pp = f.positive_int(data, "pp", origin)
    if not isinstance(value, list) or len(value) != pp or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= limits.MAX_LAYERS for x in value):
        raise AdvisorError(f"{origin}: key 'swap_layers' must be a list of non-negative layer counts, one per pipeline "
                           f"stage ({pp}), got {prefix(value)}")
    return tuple(value)


def _layer_counts(value):
    return list(value) if isinstance(value, tuple) else value


# Largest gradient bucket accepted (MiB): 1 TiB, beyond any device's memory
MAX_BUCKET_MB = 2.0 ** 20


@dataclass(frozen=True)
class Strategy:
    """How one candidate is parallelised: every degree and knob (module docstring for the conventions).
    Each field's Setting record (advisor.specs.setting) says how it is given, saved and searched."""

    dp: int = setting(
        kind="positive_int", maximum=limits.MAX_DEVICES, flags=("--dp",), search=True, cli_default=None, plan="always",
        required=True, help="the data-parallel degree (estimate: default devices / (tp x pp x cp))",
        doc="Data-parallel degree: replicas of the model, each on tp x pp x cp devices.")
    tp: int = setting(
        1, kind="positive_int", maximum=limits.MAX_DEVICES, flags=("--tp",), search=True, plan="always", required=True,
        help="the tensor-parallel degree", doc="Tensor-parallel degree: each layer's matrices split over tp devices "
        "(Megatron-LM, Shoeybi et al. 2019).")
    pp: int = setting(
        1, kind="positive_int", maximum=limits.MAX_DEVICES, flags=("--pp",), search=True, plan="always", required=True,
        help="the pipeline-parallel degree (stages)", doc="Pipeline-parallel degree: stages of consecutive layers.")
    cp: int = setting(
        1, kind="positive_int", maximum=limits.MAX_DEVICES, flags=("--cp",), search=True, plan="always",
        help="the context-parallel degree (the sequence split over devices)",
        doc="Context-parallel degree: each sequence split over cp devices (cp_comm says how attention exchanges).")
    ep: int = setting(
        1, kind="positive_int", maximum=limits.MAX_DEVICES, flags=("--ep",), search=True, plan="always",
        help="the expert-parallel degree (MoE models)",
        doc="Expert-parallel degree (MoE): experts spread over ep of the dp x cp ranks (of tp x dp x cp with "
            "fold_experts).")
    fold_experts: bool = setting(
        False, kind="boolean", flags=("--fold-experts",), search=True,
        frameworks={
            # megatron/training/arguments.py (core_v0.13-0.15): --expert-tensor-parallel-size, default the tp size
            "megatron": {"true": "--expert-tensor-parallel-size 1"},
            # torchtitan/config/job_config.py (v0.2.0) [parallelism]: etp 1 ("partial dp + all tp -> ep") or tp
            "torchtitan": {"true": "parallelism.expert_tensor_parallel_degree = 1"},
        },
        help="MoE parallel folding: experts whole on each rank, expert parallelism over the tensor-parallel ranks "
             "too (Megatron --expert-tensor-parallel-size 1; torchtitan expert_tensor_parallel_degree 1)",
        doc="MoE parallel folding (Liu et al. 2025, arXiv 2504.14960; Megatron-Core): the routed experts are not split over the "
            "tensor-parallel group (expert tensor parallelism 1); ep takes its ranks from tp x cp x dp, so ep may "
            "reach tp x dp x cp, and the MoE block's tensor-parallel collective goes (advisor.cost.placement, "
            "memory, compute, layer_comm).")
    sequence_parallel: bool = setting(
        False, kind="boolean", flags=("--sequence-parallel",), search=True, plan="always",
        help="sequence parallelism over the tp group",
        doc="Sequence parallelism: the norms' and dropouts' activations split over the tp group (Korthikanti "
            "et al. 2022).")
    virtual_pipeline_stages: int = setting(
        1, kind="positive_int", maximum=limits.MAX_LAYERS, flags=("--vpp",), search=True, plan="always",
        help="the virtual pipeline stages (interleaved 1F1B when > 1)",
        doc="Chunks per physical pipeline stage (Megatron's interleaved 1F1B, Narayanan et al. SC'21).")
    micro_batch_size: int = setting(
        1, kind="positive_int", maximum=limits.MAX_GLOBAL_BATCH, flags=("--mbs",), search=True, plan="always",
        help="the micro-batch size (sequences)", doc="Sequences per micro-batch.")
    num_micro_batches: int = setting(
        1, kind="positive_int", maximum=limits.MAX_GLOBAL_BATCH, plan="always",
        doc="Micro-batches per step and replica: global batch / (dp x micro-batch size).")
    zero_stage: int = setting(
        0, kind="choice", choices=(0, 1, 2, 3), flags=("--zero",), search=True, plan="always",
        help="the ZeRO stage 0-3", doc="ZeRO stage (Rajbhandari et al. 2020): 1 shards the optimizer states over "
        "the data-parallel group, 2 also the gradients, 3 also the weights.")
    recompute: str = setting(
        "none", kind="choice", choices=RECOMPUTE, flags=("--recompute",), search=True, plan="always",
        help="none | selective | full",
        doc="Activation recomputation: none, selective (what the framework's record replays; "
            "advisor.cost.recompute) or full (only each layer's input kept).")
    recompute_layers: int | tuple[int, ...] | None = setting(
        None, optional=True, flags=("--recompute-layers",), parse=lambda text: _recompute_counts(text),
        commands=("estimate",), plan="always", read=_recompute_layers, write=_layer_counts,
        help="with full: layers per stage, one count for every stage or one per stage (8,6)",
        doc="Recompute only this many layers per stage (None: all): one count for every stage (Megatron's "
            "--recompute-num-layers) or one per stage (MindFormers' recompute / select_recompute lists).")
    pipeline_schedule: str = setting(
        "1f1b", kind="choice", choices=SCHEDULES, flags=("--schedule",), search=True, cli_default=None, plan="always",
        help="gpipe | 1f1b | interleaved-1f1b", doc="The pipeline schedule (interleaved-1f1b with virtual stages).")
    stage_layers: tuple[int, ...] | None = setting(
        None, plan="always", read=_stage_layers, write=_layer_counts, flags=("--stage-layers",),
        commands=("estimate",), parse=lambda text: _counts(text, "--stage-layers", 1),
        help="transformer layers per pipeline stage, comma-separated, first stage first (e.g. 15,16,16,16,16,16,16,15 "
             "for Megatron's uneven split; default an even split)",
        doc="Transformer layers per physical pipeline stage (None: an even split; the plan holds the resolved split).")
    mesh_order: tuple[str, ...] = setting(
        DEFAULT_MESH_ORDER, plan="always", read=_mesh_order, write=list,
        doc="The mesh dimensions from outermost to innermost: the last one gets consecutive ranks (the fastest links).")
    offload_optimizer: bool = setting(
        False, kind="boolean", flags=("--offload", "--offload-optimizer"), search=True, plan="always",
        help="keep optimizer states in host memory",
        doc="Optimizer states (and their update) in host memory (ZeRO-Offload, Ren et al. 2021; Megatron "
            "--optimizer-cpu-offload); needs ZeRO 1 or more.")
    cp_comm: str = setting(
        "p2p", kind="choice", choices=CP_COMM, flags=("--cp-comm",), search=True, plan="always",
        help="p2p (ring attention) | a2a (Ulysses) context parallelism",
        doc="Context-parallel communication, as Megatron-Core's --cp-comm-type: p2p = ring attention (K/V blocks "
            "passed around the ring, overlapped with attention; Liu et al. 2023), a2a = Ulysses (all-to-alls that "
            "trade the sequence split for a head split; Jacobs et al. 2023).")
    grad_bucket_mb: float | None = setting(
        None, kind="positive_float", maximum=MAX_BUCKET_MB, optional=True, flags=("--bucket-mb",),
        commands=("estimate",), help="gradient bucket size in MiB (communication fusion, ZeRO 0/1; default: the framework's)",
        doc="Communication fusion: data-parallel gradient bucket size in MiB (None: the framework's default "
            "buckets; advisor.cost.fusion).")
    micro_batch_copies: int = setting(
        1, kind="positive_int", maximum=limits.MAX_GLOBAL_BATCH, flags=("--copies",), commands=("estimate",),
        help="multi-copy parallelism: split each micro-batch into this many copies (MindSpore micro_batch_interleave_num)",
        doc="Multi-copy parallelism: copies each micro-batch is split into so that one copy's tensor-parallel "
            "collectives run under another's compute (MindSpore MicroBatchInterleaved; advisor.cost.multi_copy).")
    swap_layers: tuple[int, ...] | None = setting(
        None, read=_swap_layers, write=list, flags=("--swap-layers",), commands=("estimate",),
        parse=lambda text: _counts(text, "--swap-layers", 0),
        help="per stage, how many of its first layers swap their activations to the host (4,4,2,0)",
        doc="Activation swapping (vPipe): per stage, how many of its first layers send their saved activations to "
            "the host after the forward and fetch them back for the backward (MindFormers' swap_config layer_swap; "
            "advisor.cost.swap). None: none.")
    full_batch: bool = setting(
        False, kind="boolean", flags=("--full-batch",), commands=("estimate",),
        help="every rank reads the whole global batch (MindSpore full_batch=True) instead of its data-parallel shard",
        doc="Dataset sharding: every rank reads the whole global batch (MindSpore full_batch=True) instead of its "
            "data-parallel shard (advisor.cost.dataset).")
    offload_params: bool = setting(
        False, kind="boolean", flags=("--offload-params",), search=True,
        help="keep weights and gradients in host memory too (ZeRO-Infinity; with --zero 3 --offload-optimizer)",
        doc="Parameter offload (ZeRO-Infinity's offload_param, FSDP2's CPUOffloadPolicy): the sharded weights and "
            "gradients live in host memory and cross PCIe every micro-batch; needs ZeRO-3 and the optimizer "
            "offloaded (advisor.cost.step).")
    offload_fraction: float = setting(
        1.0, kind="fraction", flags=("--offload-fraction",), commands=("estimate",),
        help="share of the optimizer offloaded (Megatron --optimizer-offload-fraction)",
        doc="The share of the optimizer states (and of its update) kept on the host when the optimizer is "
            "offloaded; the rest stays on the device (Megatron's --optimizer-offload-fraction, DeepSpeed's "
            "offload_optimizer.ratio).")
    host_embedding: bool = setting(
        False, kind="boolean", flags=("--host-embedding",), search=True,
        help="the word-embedding table, its lookup and its optimizer on the host CPU (MindSpore Host&Device "
             "training; --framework mindspore, untied embeddings)",
        doc="Host&Device heterogeneous training: the word-embedding table and its lookup on the host CPU, updated "
            "there by a host optimizer (MindSpore Gather.set_device(\"CPU\"), Optimizer.target = \"CPU\"; "
            "advisor.cost.host_embedding).")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """The tensor-parallel degree of the routed experts: 1 when folded, tp otherwise."""
        return 1 if self.fold_experts else self.tp

    def degree(self, dim: str) -> int:
        return getattr(self, dim)

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours of one group of this mesh dimension."""
        order = list(self.mesh_order)
        inner = order[order.index(dim) + 1:]
        return int(np.prod([self.degree(d) for d in inner], dtype=np.int64))

    def recompute_counts(self) -> tuple[int, ...] | None:
        """Recomputed layers per stage, one entry per stage (None: every layer of every stage); a
        stage recomputes at most the layers it has."""
        if self.recompute_layers is None or isinstance(self.recompute_layers, tuple):
            return self.recompute_layers
        return (self.recompute_layers,) * self.pp

    def resolved_stage_layers(self, num_layers: int) -> tuple[int, ...]:
        if self.stage_layers is not None:
            return tuple(self.stage_layers)
        return even_stage_layers(num_layers, self.pp)


def even_stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Split layers as evenly as possible; the extra layers go to the middle stages, whose
    neighbours (embedding on the first, LM head on the last) are lighter."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


_INT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "virtual_pipeline_stages", "micro_batch_size", "num_micro_batches", "zero_stage")


@dataclass(frozen=True)
class StrategyBatch:
    """N candidates as parallel numpy arrays (the cost model's vectorized input).

    Enumerated fields are integer codes: recompute indexes RECOMPUTE, schedule indexes SCHEDULES.
    ``stage_layers`` is an (N, P) integer array, P the largest pp of the batch, zero-padded past each
    candidate's pp; ``recompute_layers`` is (N, P) too: the recomputed layers of each stage, -1 for
    "all of them". Strides give the rank distance of
    each mesh dimension's groups (from the mesh order).
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    sequence_parallel: np.ndarray
    virtual_pipeline_stages: np.ndarray
    micro_batch_size: np.ndarray
    num_micro_batches: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    pipeline_schedule: np.ndarray
    offload_optimizer: np.ndarray
    stage_layers: np.ndarray
    tp_stride: np.ndarray
    dp_stride: np.ndarray
    cp_stride: np.ndarray
    pp_stride: np.ndarray
    mesh_order: tuple[tuple[str, ...], ...] = field(default=(), compare=False)
    cp_comm: np.ndarray | None = None          # index into CP_COMM; None: all p2p
    grad_bucket_mb: np.ndarray | None = None   # MiB; 0: the framework's default buckets; None: all 0
    micro_batch_copies: np.ndarray | None = None   # None: all 1
    swap_layers: np.ndarray | None = None          # (N, P) layers swapped per stage; None: all 0
    full_batch: np.ndarray | None = None           # bool; None: all sharded
    offload_params: np.ndarray | None = None       # bool; None: none
    offload_fraction: np.ndarray | None = None     # None: all 1
    host_embedding: np.ndarray | None = None       # bool; None: all on the device
    fold_experts: np.ndarray | None = None         # bool; None: experts split over tp (no folding)
    # a batch of some of each candidate's stages (advisor.cost.memory.peak_stages): (N, P) each column's stage
    # index (pp on a padding column) and first layer; None: column i is stage i (every stage, in order)
    stage_index: np.ndarray | None = None
    stage_start_layer: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.fold_experts is None:
            object.__setattr__(self, "fold_experts", np.zeros(len(self.dp), dtype=bool))
        if self.host_embedding is None:
            object.__setattr__(self, "host_embedding", np.zeros(len(self.dp), dtype=bool))
        if self.offload_fraction is None:
            object.__setattr__(self, "offload_fraction", np.ones(len(self.dp)))
        if self.offload_params is None:
            object.__setattr__(self, "offload_params", np.zeros(len(self.dp), dtype=bool))
        if self.full_batch is None:
            object.__setattr__(self, "full_batch", np.zeros(len(self.dp), dtype=bool))
        if self.cp_comm is None:
            object.__setattr__(self, "cp_comm", np.zeros(len(self.dp), dtype=np.int64))
        if self.grad_bucket_mb is None:
            object.__setattr__(self, "grad_bucket_mb", np.zeros(len(self.dp)))
        if self.micro_batch_copies is None:
            object.__setattr__(self, "micro_batch_copies", np.ones(len(self.dp), dtype=np.int64))
        if self.swap_layers is None:
            object.__setattr__(self, "swap_layers", np.zeros(self.stage_layers.shape, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def expert_tp(self) -> np.ndarray:
        """The routed experts' tensor-parallel degree per candidate: 1 when folded, tp otherwise (Strategy.expert_tp)."""
        return np.where(self.fold_experts, 1, self.tp)

    @staticmethod
    def from_strategies(strategies: Sequence[Strategy], num_layers: int) -> "StrategyBatch":
        n = len(strategies)
        width = max((s.pp for s in strategies), default=1)
        stage = np.zeros((n, width), dtype=np.int64)
        recomputed = np.full((n, width), -1, dtype=np.int64)
        swapped = np.zeros((n, width), dtype=np.int64)
        for i, s in enumerate(strategies):
            layers = s.resolved_stage_layers(num_layers)
            stage[i, : len(layers)] = layers
            counts = s.recompute_counts()
            if counts is not None:
                recomputed[i, : min(len(counts), width)] = counts[:width]
            if s.swap_layers is not None:
                swapped[i, : min(len(s.swap_layers), width)] = s.swap_layers[:width]
        arr = {k: np.array([getattr(s, k) for s in strategies], dtype=np.int64) for k in _INT_FIELDS}
        return StrategyBatch(
            **arr,
            sequence_parallel=np.array([s.sequence_parallel for s in strategies], dtype=bool),
            recompute=np.array([RECOMPUTE.index(s.recompute) for s in strategies], dtype=np.int64),
            recompute_layers=recomputed,
            pipeline_schedule=np.array([SCHEDULES.index(s.pipeline_schedule) for s in strategies], dtype=np.int64),
            offload_optimizer=np.array([s.offload_optimizer for s in strategies], dtype=bool),
            stage_layers=stage,
            tp_stride=np.array([s.stride("tp") for s in strategies], dtype=np.int64),
            dp_stride=np.array([s.stride("dp") for s in strategies], dtype=np.int64),
            cp_stride=np.array([s.stride("cp") for s in strategies], dtype=np.int64),
            pp_stride=np.array([s.stride("pp") for s in strategies], dtype=np.int64),
            mesh_order=tuple(tuple(s.mesh_order) for s in strategies),
            cp_comm=np.array([CP_COMM.index(s.cp_comm) for s in strategies], dtype=np.int64),
            grad_bucket_mb=np.array([s.grad_bucket_mb or 0.0 for s in strategies], dtype=float),
            micro_batch_copies=np.array([s.micro_batch_copies for s in strategies], dtype=np.int64),
            swap_layers=swapped,
            full_batch=np.array([s.full_batch for s in strategies], dtype=bool),
            offload_params=np.array([s.offload_params for s in strategies], dtype=bool),
            offload_fraction=np.array([s.offload_fraction for s in strategies], dtype=float),
            host_embedding=np.array([s.host_embedding for s in strategies], dtype=bool),
            fold_experts=np.array([s.fold_experts for s in strategies], dtype=bool),
        )

    def take(self, index) -> "StrategyBatch":
        """A sub-batch (boolean mask or integer indices)."""
        idx = np.asarray(index)
        values = {}
        for fl in fields(self):
            v = getattr(self, fl.name)
            if fl.name == "mesh_order":
                picked = np.arange(len(self))[idx] if idx.dtype == bool else idx
                values[fl.name] = tuple(v[int(i)] for i in np.atleast_1d(picked)) if v else ()
            else:
                values[fl.name] = None if v is None else v[idx]
        return StrategyBatch(**values)

    def strategy(self, i: int) -> Strategy:
        """Candidate i as a Strategy."""
        pp = int(self.pp[i])
        rl = tuple(int(x) for x in self.recompute_layers[i, :pp])
        return Strategy(
            dp=int(self.dp[i]), tp=int(self.tp[i]), pp=pp, cp=int(self.cp[i]), ep=int(self.ep[i]),
            sequence_parallel=bool(self.sequence_parallel[i]),
            virtual_pipeline_stages=int(self.virtual_pipeline_stages[i]),
            micro_batch_size=int(self.micro_batch_size[i]), num_micro_batches=int(self.num_micro_batches[i]),
            zero_stage=int(self.zero_stage[i]), recompute=RECOMPUTE[int(self.recompute[i])],
            recompute_layers=None if min(rl) < 0 else (rl[0] if len(set(rl)) == 1 else rl),
            pipeline_schedule=SCHEDULES[int(self.pipeline_schedule[i])],
            stage_layers=tuple(int(x) for x in self.stage_layers[i, :pp]),
            offload_optimizer=bool(self.offload_optimizer[i]),
            mesh_order=self.mesh_order[i] if self.mesh_order else DEFAULT_MESH_ORDER,
            cp_comm=CP_COMM[int(self.cp_comm[i])],
            grad_bucket_mb=float(self.grad_bucket_mb[i]) if self.grad_bucket_mb[i] > 0 else None,
            micro_batch_copies=int(self.micro_batch_copies[i]),
            swap_layers=tuple(int(x) for x in self.swap_layers[i, :pp]) if self.swap_layers[i, :pp].any() else None,
            full_batch=bool(self.full_batch[i]),
            offload_params=bool(self.offload_params[i]),
            offload_fraction=float(self.offload_fraction[i]),
            host_embedding=bool(self.host_embedding[i]),
            fold_experts=bool(self.fold_experts[i]),
        )
