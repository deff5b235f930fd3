"""The enumerator's space (advisor.search.enumerate): which candidates are generated.

Parallel degrees, pipeline schedules, micro-batch sizes, sequence parallelism and recomputation as
rows, with the legality rules of advisor.space.rules applied and every removed row counted; the
ZeRO/offload pairs, mesh orders and context-parallel communication each skeleton is crossed with,
and the de-duplication counts of that crossing.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from advisor.errors import AdvisorError
from advisor.cost.comm import slowest_tier
from advisor.search import Pins
from advisor.search.enumerate_rows import (
    _IS_REPRESENTATIVE, HOST_EMBEDDING, MESH_ORDERS, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS, OPTIMIZER_ON_HOST, Rows,
    _active_code, _add, _concat, _count, _cross, _options, _take,
    chunks_by_pp, divisors, mesh_strides, to_batch,
)
from advisor.space.rules import builds_order, illegal_masks, zero_illegal
from advisor.space.strategy import INTERLEAVED, MESH_DIMS, ONE_F_ONE_B, RECOMPUTE, SCHEDULES
from advisor.specs.frameworks import FRAMEWORKS, Framework, frameworks_with
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)
HCCS_REASON = "TP group would span HCCS groups"
FRAMEWORK_ZERO_REASON = "framework zero"          # the rule of advisor.space.rules the option mask applies
FRAMEWORK_MESH_REASON = "framework mesh order"
FRAMEWORK_CP_REASON = "framework context parallel"
FRAMEWORK_SP_REASON = "framework sequence parallel"
# Rules on the ZeRO/offload pair, mesh order and context-parallel kind: applied where skeletons are crossed with
# them (option_mask, order_variants, cp_comm_options), not to the skeletons, which carry neither yet.
CROSSED_RULES = (FRAMEWORK_ZERO_REASON, FRAMEWORK_MESH_REASON, FRAMEWORK_CP_REASON)


def _apply_rules(model: ModelSpec, cluster: Cluster, job: TrainingJob, rows: Rows, pruned: Counter,
                 later: tuple[str, ...] = ()) -> Rows:
    """Keep the legal rows; count each illegal one under the first rule that rejects it. Rows are
    checked one pipeline depth at a time so the stage arrays stay narrow. The rules on what a skeleton is
    crossed with later (CROSSED_RULES) are applied by that crossing, and ``later`` ones once the rows carry
    what they judge."""
    alive = np.zeros(_count(rows), dtype=bool)
    for idx in chunks_by_pp(rows):
        ok = np.ones(len(idx), dtype=bool)
        for name, mask in illegal_masks(model, cluster, job, to_batch(model, job, _take(rows, idx))).items():
            if name in CROSSED_RULES or name in later:
                continue
            hit = mask & ok
            if hit.any():
                pruned[name] += int(hit.sum())
            ok &= ~mask
        alive[idx] = ok
    return _take(rows, alive)


# ---- the space ----------------------------------------------------------------------------------
def tp_inside_fast_group(hw: HardwareProfile, tp: np.ndarray, tp_stride: np.ndarray) -> np.ndarray:
    """True where every TP group stays inside one fast group (an HCCS group on mesh-groups nodes):
    the slowest tier it spans is the first, and its aligned blocks tile the fast group."""
    span = tp * tp_stride
    return (tp == 1) | ((slowest_tier(hw, tp, tp_stride) == 0) & (hw.node.group_size % span == 0))


def _keeps_tp_in_group(hw: HardwareProfile, pins: Pins) -> bool:
    """Ascend-style nodes: a searched TP group never spans two HCCS groups (slow PCIe between them)."""
    return hw.node.group_size < hw.node.devices_per_node and pins.tp is None


def degree_rows(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins,
                pruned: Counter) -> Rows:
    """Legal (dp, tp, pp, cp, ep) combinations."""
    n = cluster.devices
    divs = divisors(n)
    tp, pp, cp = (a.ravel() for a in np.meshgrid(_options(pins.tp, divs), _options(pins.pp, divs),
                                                  _options(pins.cp, divs), indexing="ij"))
    fits = n % (tp * pp * cp) == 0
    tp, pp, cp = tp[fits], pp[fits], cp[fits]
    rows = {"dp": n // (tp * pp * cp), "tp": tp, "pp": pp, "cp": cp}
    if pins.dp is not None:
        rows = _take(rows, rows["dp"] == pins.dp)
    experts = divisors(model.moe.num_experts) if model.moe is not None else np.array([1])
    rows = _cross(rows, {"ep": _options(pins.ep, experts)})
    if model.moe is not None or pins.fold_experts:   # MoE parallel folding (a pin on a dense model: the rule refuses)
        folds = [0, 1] if pins.fold_experts is None else [int(pins.fold_experts)]
        rows = _cross(rows, {"fold": folds})
        if pins.fold_experts is None:  # with tp = 1 or ep = 1 folding is the same plan: not a candidate
            rows = _take(rows, (rows["fold"] == 0) | ((rows["tp"] > 1) & (rows["ep"] > 1)))
    # Deeper pipelines than layers break the "stage layers" rule; counted here without building
    # their (rows x pp) stage arrays.
    deep = rows["pp"] > model.num_layers
    if deep.any():
        pruned["stage layers"] += int(deep.sum())
        rows = _take(rows, ~deep)
    if _keeps_tp_in_group(hw, pins):
        split = ~tp_inside_fast_group(hw, rows["tp"], np.ones_like(rows["tp"]))
        if split.any():
            pruned[HCCS_REASON] += int(split.sum())
            rows = _take(rows, ~split)
    # degree rows carry no sequence-parallel choice yet (torchtitan needs it on with tp > 1): judged on skeletons
    return _apply_rules(model, cluster, job, rows, pruned, later=(FRAMEWORK_SP_REASON,))


def _expand_micro_batches(rows: Rows, job: TrainingJob, pins: Pins) -> Rows:
    """Micro-batch sizes dividing each replica's share of the global batch (a pinned size is kept
    as given; the "global batch" rule judges it)."""
    out = _cross(rows, {"mbs": _options(pins.micro_batch_size, divisors(job.global_batch_size))})
    if pins.micro_batch_size is None:
        out = _take(out, (job.global_batch_size // out["dp"]) % out["mbs"] == 0)
    out["m"] = np.maximum(job.global_batch_size // (out["dp"] * out["mbs"]), 1)
    return out


def _expand_pipeline(rows: Rows, model: ModelSpec, pins: Pins, dedup: Counter) -> Rows:
    """(schedule, virtual stages): with pp = 1 only 1F1B (every schedule is the same there);
    interleaving with each virtual-stage count dividing the layers per stage."""
    single = rows["pp"] == 1
    wanted_schedules = [pins.pipeline_schedule] if pins.pipeline_schedule else list(SCHEDULES)
    flat = _take(rows, single)
    if _count(flat):
        if pins.pipeline_schedule is None:
            dedup["pipeline schedule with pp = 1"] += _count(flat)   # GPipe, identical to 1F1B here
        sched = SCHEDULES.index(pins.pipeline_schedule) if pins.pipeline_schedule else ONE_F_ONE_B
        flat = _cross(flat, {"schedule": [sched], "vpp": [_pin_or(pins.virtual_pipeline_stages, 1)]})
    deep = _take(rows, ~single)
    parts = [flat]
    if _count(deep):
        plain = [SCHEDULES.index(s) for s in wanted_schedules if s != "interleaved-1f1b"]
        if plain and pins.virtual_pipeline_stages in (None, 1):
            parts.append(_cross(deep, {"schedule": plain, "vpp": [1] * len(plain)}))
        if "interleaved-1f1b" in wanted_schedules:
            vs = _options(pins.virtual_pipeline_stages, divisors(model.num_layers)[1:])
            inter = _cross(deep, {"vpp": vs})
            per_stage = np.maximum(model.num_layers // inter["pp"], 1)
            inter = _take(inter, (per_stage % inter["vpp"] == 0) | (pins.virtual_pipeline_stages is not None))
            inter["schedule"] = np.full(_count(inter), INTERLEAVED, dtype=np.int64)
            parts.append(inter)
    return _concat([p for p in parts if _count(p)], {**rows, "schedule": rows["pp"], "vpp": rows["pp"]})


def _pin_or(value, default):
    return default if value is None else value


def _expand_sequence_parallel(rows: Rows, pins: Pins, dedup: Counter) -> Rows:
    options = [0, 1] if pins.sequence_parallel is None else [int(pins.sequence_parallel)]
    out = _cross(rows, {"sp": options})
    redundant = (out["tp"] == 1) & (out["sp"] == 1) & (pins.sequence_parallel is None)
    if redundant.any():
        dedup["sequence parallelism with tp = 1"] += int(redundant.sum())
    return _take(out, ~redundant)


def skeleton_rows(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, pins: Pins,
                  pruned: Counter, dedup: Counter) -> Rows:
    """Legal candidates without their ZeRO/offload choice and mesh order. Column "family" numbers
    the skeletons that differ only in sequence parallelism and recomputation (see family_bounds)."""
    rows = degree_rows(model, hw, cluster, job, pins, pruned)
    rows = _expand_pipeline(rows, model, pins, dedup)
    rows = _expand_micro_batches(rows, job, pins)
    rows["family"] = np.arange(_count(rows))
    rows = _expand_sequence_parallel(rows, pins, dedup)
    recompute = [RECOMPUTE.index(pins.recompute)] if pins.recompute else list(range(len(RECOMPUTE)))
    rows = _cross(rows, {"recompute": recompute})
    return _apply_rules(model, cluster, job, rows, pruned)


def zero_offload_options(pins: Pins, framework: str | Framework | None = None,
                         model: ModelSpec | None = None) -> list[tuple[int, int]]:
    """(ZeRO stage, offload) pairs allowed by the pins. Offload 1: the optimizer states, which needs
    ZeRO >= 1 (rule "offload needs zero"); 2: the weights and gradients too, with ZeRO-3 and a
    framework that has it (rule "parameter offload": not Megatron-LM); 3 and 4: 0 and 1 with the word
    embedding on the host, for MindSpore and a table not tied to the head (rule "host embedding";
    only where ``model`` is given)."""
    record = framework if isinstance(framework, Framework) else FRAMEWORKS.get(framework)   # a release's record too
    runs = set(ZERO_STAGES) if record is None else set(record.zero_stages) | set(record.zero_stages_under_pipeline)
    zeros = [pins.zero_stage] if pins.zero_stage is not None else [z for z in ZERO_STAGES if z in runs]
    offloads = [int(pins.offload_optimizer)] if pins.offload_optimizer is not None else [0, 1]
    pairs = [(z, o) for z in zeros for o in offloads if not (o and z == 0)]
    offloads_params = record is None or record.parameter_offload
    if not offloads_params and pins.offload_params:
        raise AdvisorError(f"--offload-params: {record.title} has no parameter offload; give --framework "
                           f"{frameworks_with('parameter_offload')}")
    if (pins.offload_params is not False and pins.offload_optimizer is not False and 3 in zeros
            and offloads_params):
        pairs.append((3, 2))
    if pins.offload_params:
        return [p for p in pairs if p[1] == OFFLOAD_PARAMS]
    return _with_host_embedding(pairs, pins, None if record is None else record.name, model)


def _with_host_embedding(pairs, pins: Pins, framework: str | None, model: ModelSpec | None):
    if pins.host_embedding is False or model is None:
        return pairs
    record = FRAMEWORKS.get(framework)
    why = ("the word embedding on the host is MindSpore's Host&Device training: give --framework "
           f"{frameworks_with('host_embedding')}" if record is None or not record.host_embedding else
           f"{model.name} ties its embedding to the output head, which stays on the device"
           if model.tie_embeddings else None)
    if why is not None:
        if pins.host_embedding:
            raise AdvisorError(f"--host-embedding: {why}")
        return pairs
    hosted = [(z, o + HOST_EMBEDDING) for z, o in pairs if o in (0, OFFLOAD_OPTIMIZER)]
    return hosted if pins.host_embedding else pairs + hosted


def _lone_options(options: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Without data parallelism (dp x cp = 1) a ZeRO stage shards nothing: the lowest allowed stage
    stands for all of them (with and without offload)."""
    lowest: dict[int, int] = {}
    for z, o in options:
        lowest[o] = min(z, lowest.get(o, z))
    return [(z, o) for o, z in sorted(lowest.items())]


def _framework_runs(rows: Rows, options: list[tuple[int, int]], framework: Framework | None) -> np.ndarray:
    """(rows, options) bool: the ZeRO/offload pairs the framework runs at each row's pipeline depth
    (advisor.space.rules.zero_illegal, the rule "framework zero")."""
    n = _count(rows)
    if framework is None or not options:
        return np.ones((n, len(options)), dtype=bool)
    z = np.array([z for z, _ in options])[None, :]
    o = np.array([o for _, o in options])[None, :]
    col = {d: rows[d][:, None] if d in rows else np.ones((n, 1), dtype=np.int64) for d in ("pp", "ep", "cp", "tp")}
    fold = rows["fold"][:, None] if "fold" in rows else np.zeros((n, 1), dtype=np.int64)
    # the ranks ep must be a multiple of where it borrows from sharded dp: cp, tp x cp with the experts folded
    return ~zero_illegal(framework, z, col["pp"], np.isin(o, OPTIMIZER_ON_HOST), o == OFFLOAD_PARAMS,
                         col["ep"], col["cp"], np.where(fold > 0, col["tp"], 1))


def option_mask(rows: Rows, options: list[tuple[int, int]], framework: Framework | None = None) -> np.ndarray:
    """(rows, options) bool: the ZeRO/offload pairs each row is crossed with: those the framework runs there,
    and without data parallelism (dp x cp = 1, where a stage shards nothing) only the lowest such stage for
    each offload choice."""
    runs = _framework_runs(rows, options, framework)
    solo = rows["dp"] * rows["cp"] == 1
    codes = np.array([o for _, o in options])
    lowest = np.zeros_like(runs)
    for code in np.unique(codes):
        cols = np.flatnonzero(codes == code)          # options list each offload choice by rising stage
        sub = runs[:, cols]
        first = np.argmax(sub, axis=1)
        pick = np.zeros_like(sub)
        pick[np.arange(len(sub)), first] = sub[np.arange(len(sub)), first]
        lowest[:, cols] = pick
    return np.where(solo[:, None], lowest, runs)


def zero_variants(rows: Rows, options: list[tuple[int, int]], framework: Framework | None = None) -> Rows:
    """Each row with each ZeRO/offload pair it can use (option_mask)."""
    keep = option_mask(rows, options, framework)
    out = _cross(rows, {"zero": [z for z, _ in options], "offload": [o for _, o in options]})
    return _take(out, keep.ravel())


def cp_comm_options(model: ModelSpec, rows: Rows, pins: Pins, framework: Framework | None = None) -> np.ndarray:
    """(rows, 2) bool: whether each row can use ring (p2p) and Ulysses (a2a) context parallelism, as the
    framework runs them (its cp_kinds, and context parallelism under pipelining). Without context parallelism
    only p2p is generated (the choice changes nothing)."""
    split = rows["tp"] * rows["cp"]
    a2a = (rows["cp"] > 1) & (model.num_attention_heads % split == 0) & (model.num_kv_heads % split == 0)
    p2p = np.ones_like(a2a)
    if pins.cp_comm is not None:
        a2a &= pins.cp_comm == "a2a"
        p2p &= (pins.cp_comm == "p2p") | (rows["cp"] == 1)
    if framework is not None:
        cp = rows["cp"] > 1
        runs = ~cp | (rows["pp"] == 1) | framework.cp_under_pipeline
        a2a &= runs & ("a2a" in framework.cp_kinds)
        p2p &= ~cp | (runs & ("p2p" in framework.cp_kinds))
    return np.stack([p2p, a2a], axis=1)


@lru_cache(maxsize=None)
def _framework_order_table(framework: Framework | None) -> np.ndarray:
    """(16, orders) bool: whether mesh order j is one the framework builds, by active-dimension code
    (advisor.search.enumerate_rows._active_code; the rule "framework mesh order", advisor.space.rules.builds_order)."""
    if framework is None:
        return np.ones((16, len(MESH_ORDERS)), dtype=bool)
    return np.array([[builds_order(framework, order, code) for order in MESH_ORDERS] for code in range(16)])


def order_variants(rows: Rows, hw: HardwareProfile, pins: Pins, framework: Framework | None = None) -> Rows:
    """Each row with each mesh order that gives distinct strides, that the framework builds and, on HCCS
    nodes, keeps TP in one group (unless TP is pinned)."""
    out = _cross(rows, {"mesh": np.arange(len(MESH_ORDERS))})
    code = _active_code(out)
    keep = _IS_REPRESENTATIVE[code, out["mesh"]] & _framework_order_table(framework)[code, out["mesh"]]
    if _keeps_tp_in_group(hw, pins):
        keep &= tp_inside_fast_group(hw, out["tp"], mesh_strides(out, out["mesh"])["tp_stride"])
    return _take(out, keep)


def cp_kind_variants(rows: Rows, model: ModelSpec, pins: Pins, framework: Framework | None = None) -> Rows:
    """Each row with each context-parallel communication it can use (cp_comm_options)."""
    out = _cross(rows, {"cp_comm": [0, 1]})
    allowed = cp_comm_options(model, out, pins, framework)
    return _take(out, allowed[np.arange(_count(out)), out["cp_comm"]])


def mesh_variants(rows: Rows, hw: HardwareProfile, pins: Pins, model: ModelSpec,
                  framework: Framework | None = None) -> Rows:
    """order_variants, each with each context-parallel communication it can use."""
    return cp_kind_variants(order_variants(rows, hw, pins, framework), model, pins, framework)


def mesh_counts(skel: Rows, hw: HardwareProfile, pins: Pins, options, pruned: Counter, dedup: Counter,
                model: ModelSpec, framework: Framework | None = None) -> np.ndarray:
    """How many (mesh order, context-parallel communication) variants each skeleton keeps (they depend
    on the degrees only, so the orders are worked out once per (tp, pp, cp, ep)); counts, in complete
    candidates, the de-duplications and prunes (HCCS groups, what the framework does not run) of crossing
    the skeletons with their ZeRO/offload pairs, mesh orders and context-parallel kinds."""
    n = _count(skel)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    base = int(max(skel["tp"].max(), skel["pp"].max(), skel["cp"].max(), skel["ep"].max())) + 1
    key = ((skel["tp"] * base + skel["pp"]) * base + skel["cp"]) * base + skel["ep"]
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    tagged = {d: skel[d][first] for d in (*MESH_DIMS, "ep")}
    tagged["row"] = np.arange(len(first))
    built = np.bincount(order_variants(tagged, hw, Pins(tp=1), framework)["row"], minlength=len(first))[inverse]
    orders = np.bincount(order_variants(tagged, hw, pins, framework)["row"], minlength=len(first))[inverse]
    kinds = cp_comm_options(model, skel, pins, framework).sum(axis=1)
    any_kind = cp_comm_options(model, skel, pins).sum(axis=1)
    reps = _IS_REPRESENTATIVE.sum(axis=1)[_active_code(skel)]
    runs = _framework_runs(skel, options, framework).sum(axis=1)
    zeros = option_mask(skel, options, framework).sum(axis=1)
    _add(pruned, FRAMEWORK_ZERO_REASON, int(((len(options) - runs) * orders * kinds).sum()))
    _add(dedup, "ZeRO stage without data parallelism", int(((runs - zeros) * orders * kinds).sum()))
    _add(dedup, "mesh orders with identical strides", int((zeros * (len(MESH_ORDERS) - reps)).sum()))
    _add(pruned, FRAMEWORK_MESH_REASON, int((zeros * (reps - built)).sum()))
    _add(pruned, HCCS_REASON, int((zeros * (built - orders)).sum()))
    _add(pruned, FRAMEWORK_CP_REASON, int((zeros * orders * (any_kind - kinds)).sum()))
    return orders * kinds
