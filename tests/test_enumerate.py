"""The exhaustive searcher (advisor/search/enumerate.py): its space, its de-duplication, its bounds,
and its answer against brute force over every knob combination."""

from __future__ import annotations

import itertools
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest

from advisor.cost.comm import slowest_tier
from advisor.cost.confidence import pessimistic_tokens_per_s
from advisor.cost.estimate import estimate, estimate_batch
from advisor.cost.memory import memory
from advisor.commands.inputs import default_dtype
from advisor.search.rank import TIE_BAND
from advisor.search import Pins
from advisor.search import enumerate as en
from advisor.search.enumerate_rows import PAD_CELLS
from advisor.space.rules import legal_mask
from advisor.space.strategy import MESH_DIMS, RECOMPUTE, SCHEDULES, Strategy, StrategyBatch, even_stage_layers
from advisor.specs.hardware import hardware_from_dict, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model, model_from_dict

SMALL_MODEL = {
    "name": "tiny", "source": "test", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
    "num_kv_heads": 4, "ffn_hidden_size": 2048, "vocab_size": 8000, "seq_length": 1024,
}
SMALL_MOE = {**SMALL_MODEL, "name": "tiny-moe", "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024}}


@lru_cache(maxsize=None)
def small_node_hardware(name: str = "dgx-a100-40g", per_node: int = 4):
    """A bundled profile with fewer devices per node, so small clusters span nodes."""
    raw = load_hardware(name).raw
    raw = {**raw, "node": {**raw["node"], "devices_per_node": per_node}}
    if raw["node"]["intra_node"].get("topology") == "mesh-groups":
        raw["node"] = {**raw["node"], "intra_node": {**raw["node"]["intra_node"], "group_size": per_node // 2}}
    return hardware_from_dict(raw, f"{name} with {per_node} per node")


def _search(model, hw, devices, gbs, pins=Pins(), top_k=3):
    cluster = Cluster.of(hw, devices=devices)
    job = TrainingJob(global_batch_size=gbs, seq_length=model.seq_length, dtype=default_dtype(hw))
    return cluster, job, en.search(model, hw, cluster, job, pins, top_k=top_k)


# ---- brute force --------------------------------------------------------------------------------
ORDERS = list(itertools.permutations(MESH_DIMS))
PIPELINES = [(SCHEDULES.index("gpipe"), 1), (SCHEDULES.index("1f1b"), 1),
             (SCHEDULES.index("interleaved-1f1b"), 2), (SCHEDULES.index("interleaved-1f1b"), 4)]


def _brute_force_batch(model, cluster, job):
    """Every combination of every knob (all 24 mesh orders, every ZeRO/offload pair, every schedule
    and virtual-stage count, ring and Ulysses context parallelism, MoE parallel folding), legal per the rules; built without
    the enumerator's code."""
    n, gbs = cluster.devices, job.global_batch_size
    divs = [d for d in range(1, max(n, gbs) + 1) if n % d == 0 or gbs % d == 0]
    experts = [d for d in range(1, model.moe.num_experts + 1) if model.moe.num_experts % d == 0] if model.moe else [1]
    degrees = [(n // (tp * pp * cp), tp, pp, cp, ep, mbs)
               for tp, pp, cp in itertools.product(divs, repeat=3) if n % (tp * pp * cp) == 0 and pp <= model.num_layers
               for ep in experts for mbs in divs if gbs % (n // (tp * pp * cp) * mbs) == 0]
    folds = (0, 1) if model.moe else (0,)            # MoE parallel folding: the experts whole, ep over tp x dp x cp
    knobs = list(itertools.product(range(len(PIPELINES)), (0, 1), range(3), range(4), (0, 1), range(len(ORDERS)), (0, 1),
                                   folds))
    d = np.repeat(np.array(degrees), len(knobs), axis=0)
    k = np.tile(np.array(knobs), (len(degrees), 1))
    dp, tp, pp, cp, ep, mbs = d.T
    schedule, vpp = np.array(PIPELINES)[k[:, 0]].T
    degree = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}
    position = np.array([[order.index(dim) for dim in MESH_DIMS] for order in ORDERS])[k[:, 5]]
    strides = {}
    for j, dim in enumerate(MESH_DIMS):
        strides[f"{dim}_stride"] = np.prod([np.where(position[:, i] > position[:, j], degree[other], 1)
                                            for i, other in enumerate(MESH_DIMS)], axis=0)
    stage = np.zeros((len(dp), int(pp.max())), dtype=np.int64)
    for p in set(pp.tolist()):
        stage[pp == p, :p] = even_stage_layers(model.num_layers, p)
    batch = StrategyBatch(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=k[:, 1].astype(bool), virtual_pipeline_stages=vpp,
        micro_batch_size=mbs, num_micro_batches=gbs // (dp * mbs), zero_stage=k[:, 3], recompute=k[:, 2],
        recompute_layers=np.full(stage.shape, -1), pipeline_schedule=schedule, offload_optimizer=k[:, 4].astype(bool),
        stage_layers=stage, cp_comm=k[:, 6], mesh_order=tuple(ORDERS[i] for i in k[:, 5]),
        fold_experts=k[:, 7].astype(bool), **strides)
    return batch.take(legal_mask(model, cluster, job, batch))


def _distinct(values: np.ndarray) -> np.ndarray:
    """Distinct values (relative 1e-9), largest first."""
    return en.top_distinct(np.asarray(values), len(values))


@pytest.mark.parametrize("spec, hw_name, devices, gbs", [
    (SMALL_MODEL, "dgx-a100-40g", 8, 16),
    (SMALL_MOE, "dgx-h100", 8, 4),
    (SMALL_MODEL, "ascend-910", 8, 8),
])
def test_search_finds_what_brute_force_finds(spec, hw_name, devices, gbs):
    """Every distinct score (throughput at the pessimistic end of its band, what recommend ranks by) within the tie
    band of the K-th best distinct one is found, the same as pricing every legal combination (de-duplicated
    candidates are exact copies of kept ones)."""
    model = model_from_dict(spec, "test")
    hw = small_node_hardware(hw_name)
    cluster, job, outcome = _search(model, hw, devices, gbs, top_k=3)
    searched = estimate_batch(model, hw, cluster, job, outcome.finalists)
    assert searched.feasible.all()
    batch = _brute_force_batch(model, cluster, job)
    if hw.node.group_size < hw.node.devices_per_node:
        batch = batch.take(en.tp_inside_fast_group(hw, batch.tp, batch.tp_stride))
    e = estimate_batch(model, hw, cluster, job, batch)
    brute = _distinct(pessimistic_tokens_per_s(model, hw, job, batch, e)[e.feasible])
    limit = brute[2] * (1 - TIE_BAND)
    found = _distinct(pessimistic_tokens_per_s(model, hw, job, outcome.finalists, searched))
    assert len(found[found >= limit]) == len(brute[brute >= limit])
    assert np.allclose(found[found >= limit], brute[brute >= limit], rtol=1e-9)


def test_space_counts_add_up():
    """Every complete candidate is scored or eliminated by a bound; the counts say which."""
    model = model_from_dict(SMALL_MODEL, "test")
    hw = small_node_hardware()
    _, _, outcome = _search(model, hw, 8, 16, top_k=2)
    s = outcome.stats
    bounded = s.pruned.get(en.DEVICE_MEMORY_REASON, 0) + s.pruned.get(en.HOST_MEMORY_REASON, 0) + s.pruned.get(en.TIME_BOUND_REASON, 0)
    assert s.scored + bounded == s.candidates
    assert s.deduplicated["mesh orders with identical strides"] > 0


# ---- the space ----------------------------------------------------------------------------------
def _space(model, hw, devices, gbs, pins=Pins()):
    cluster = Cluster.of(hw, devices=devices)
    job = TrainingJob(global_batch_size=gbs, seq_length=model.seq_length, dtype=default_dtype(hw))
    pruned, dedup = Counter(), Counter()
    rows = en.skeleton_rows(model, hw, cluster, job, pins, pruned, dedup)
    return cluster, job, rows, pruned, dedup


def test_every_skeleton_is_legal_and_pins_hold():
    model = load_model("llama3-8b")
    hw = load_hardware("dgx-a100-80g")
    pins = Pins(tp=2, recompute="selective", micro_batch_size=2)
    cluster, job, rows, _, _ = _space(model, hw, 32, 64, pins)
    batch = en.to_batch(model, job, rows)
    assert legal_mask(model, cluster, job, batch).all()
    assert set(rows["tp"]) == {2} and set(rows["mbs"]) == {2} and set(rows["recompute"]) == {RECOMPUTE.index("selective")}


def test_non_power_of_two_degrees_are_searched():
    """105 layers on 280 devices: pp = 35 and pp = 7, dp = 5 all appear (Korthikanti's 530B layout)."""
    model = load_model("mt-nlg-530b")
    hw = load_hardware("dgx-a100-80g")
    _, _, rows, _, _ = _space(model, hw, 280, 280)
    assert {35, 7, 5} <= set(rows["pp"].tolist())
    assert 5 in set(rows["dp"].tolist())


def test_redundant_knobs_are_not_generated():
    model = load_model("llama3-8b")
    hw = load_hardware("dgx-a100-80g")
    _, _, rows, _, dedup = _space(model, hw, 16, 32)
    flat = rows["pp"] == 1
    assert set(rows["schedule"][flat]) == {SCHEDULES.index("1f1b")}
    assert not (rows["sp"][rows["tp"] == 1]).any()
    assert dedup["pipeline schedule with pp = 1"] > 0 and dedup["sequence parallelism with tp = 1"] > 0
    lone = en.zero_variants(rows, en.zero_offload_options(Pins()))
    single = lone["dp"] * lone["cp"] == 1
    # one replica: the lowest stage with each offload level (parameter offload needs ZeRO-3)
    assert set(zip(lone["zero"][single], lone["offload"][single])) == {(0, 0), (1, 1), (3, 2)}


def test_rules_prune_with_counts():
    """Illegal combinations are removed and counted under the rule that rejects them."""
    model = load_model("llama3-8b")   # 32 heads, 8 kv heads
    hw = load_hardware("dgx-a100-80g")
    _, _, rows, pruned, _ = _space(model, hw, 48, 48)
    assert pruned["tp divides heads"] > 0          # tp = 3, 6, 12, ... of 48 devices
    assert not np.isin(rows["tp"], [3, 6, 12, 16, 24, 48]).any()


@pytest.mark.parametrize("dims", list(itertools.product((1, 2, 3), repeat=4)))
@pytest.mark.parametrize("ep", (1, 2))
def test_mesh_orders_kept_are_exactly_the_distinct_strides(dims, ep):
    """Kept orders = one per distinct tuple of the strides that can matter: those of dimensions of
    degree > 1, and dp's when cp or ep is above 1 (the cost model reads it for the dp x cp group)."""
    rows = {d: np.array([v]) for d, v in zip(MESH_DIMS, dims)}
    rows["ep"] = np.array([ep])
    matters = {d: v > 1 for d, v in zip(MESH_DIMS, dims)}
    matters["dp"] = matters["dp"] or matters["cp"] or ep > 1

    def signature(strides, i):
        return tuple(int(strides[f"{d}_stride"][i]) if matters[d] else 0 for d in MESH_DIMS)

    every = en._cross(rows, {"mesh": np.arange(len(en.MESH_ORDERS))})
    strides = en.mesh_strides(every, every["mesh"])
    distinct = {signature(strides, i) for i in range(len(en.MESH_ORDERS))}
    kept = en.order_variants(rows, load_hardware("dgx-a100-80g"), Pins())
    kept_strides = en.mesh_strides(kept, kept["mesh"])
    kept_set = {signature(kept_strides, i) for i in range(len(kept["mesh"]))}
    assert kept_set == distinct and len(kept["mesh"]) == len(distinct)
    assert kept["mesh"][0] == en.DEFAULT_ORDER_INDEX    # the default order stands for its pattern


def test_mesh_strides_match_strategy_strides():
    rows = {"dp": np.array([3]), "tp": np.array([4]), "pp": np.array([2]), "cp": np.array([5])}
    for k, order in enumerate(en.MESH_ORDERS):
        s = Strategy(dp=3, tp=4, pp=2, cp=5, mesh_order=order)
        got = en.mesh_strides(rows, np.array([k]))
        assert all(int(got[f"{d}_stride"][0]) == s.stride(d) for d in MESH_DIMS)


def test_tp_stays_inside_hccs_groups_on_ascend_unless_pinned():
    model = load_model("gpt3-13b")
    hw = load_hardware("ascend-910")
    cluster, job, outcome = _search(model, hw, 64, 128, top_k=5)
    b = outcome.finalists
    assert len(b) > 0
    assert (slowest_tier(hw, b.tp, b.tp_stride) == 0).all() and (b.tp <= hw.node.group_size).all()
    assert outcome.stats.pruned[en.HCCS_REASON] > 0
    _, _, pinned = _search(model, hw, 64, 128, Pins(tp=8), top_k=1)
    assert len(pinned.finalists) > 0 and (pinned.finalists.tp == 8).all()


def test_stage_layers_are_chosen_in_one_place():
    model = load_model("mt-nlg-530b")     # 105 layers
    table = en.stage_layers_for(model, np.array([1, 35, 8]), np.array([1, 3, 1]))
    assert table.shape == (3, 35)
    assert table.sum(axis=1).tolist() == [105, 105, 105]
    assert (table[0, 1:] == 0).all() and (table[2, 8:] == 0).all()


# ---- bounds -------------------------------------------------------------------------------------
CASES = [("megatron-1t", "dgx-a100-80g", 512, 512), ("mixtral-8x7b", "dgx-h100", 64, 64),
         ("gpt3-175b", "ascend-910", 128, 256), ("llama3-8b", "dgx-v100", 24, 48)]


def _sample(model_name, hw_name, devices, gbs, size=600, seed=0):
    """Random whole families of skeletons (about `size` rows)."""
    model, hw = load_model(model_name), load_hardware(hw_name)
    cluster, job, rows, _, _ = _space(model, hw, devices, gbs)
    rng = np.random.default_rng(seed)
    families = np.unique(rows["family"])
    per_family = max(len(rows["dp"]) // len(families), 1)
    chosen = rng.choice(families, size=min(len(families), max(size // per_family, 1)), replace=False)
    return model, hw, cluster, job, en._take(rows, np.isin(rows["family"], chosen))


@pytest.mark.parametrize("case", CASES)
def test_bounds_never_exceed_the_real_step_time(case):
    """The family bound, the skeleton bound (free links, leanest ZeRO/offload) and the pair bound
    (fastest link everywhere) are all below the real step time of every member, ZeRO/offload pair
    and mesh order; a skeleton said not to fit has no variant that fits (and is not priced: its
    bound is infinite)."""
    model, hw, cluster, job, rows = _sample(*case)
    options = en.zero_offload_options(Pins())
    starts, family_lower = en.family_bounds(model, hw, cluster, job, rows, options)
    row_family_lower = np.repeat(family_lower, np.diff(np.r_[starts, len(rows["dp"])]))
    lower, may_fit = en.bound_skeletons(model, hw, cluster, job, rows, options)
    assert np.isfinite(lower[may_fit]).all() and np.isinf(lower[~may_fit]).all()
    assert (row_family_lower <= lower * (1 + 1e-12)).all()
    pairs = en.zero_variants({**rows, "row": np.arange(len(rows["dp"]))}, options)
    pairs["pair"] = np.arange(len(pairs["dp"]))
    fast = en.fastest_link_hardware(hw, cluster.devices, model.moe is not None)
    pair_lower = np.zeros(len(pairs["dp"]))
    for idx in en.chunks_by_pp(pairs):
        part = en._take(pairs, idx)
        ring = en.bound_step_s(estimate_batch(model, fast, cluster, job, en.to_batch(model, job, part)))
        ulysses = en.bound_step_s(estimate_batch(model, fast, cluster, job,
                                                 en.to_batch(model, job, {**part, "cp_comm": np.ones_like(part["dp"])})))
        a2a = en.cp_comm_options(model, part, Pins())[:, 1]
        pair_lower[idx] = np.where(a2a, np.minimum(ring, ulysses), ring)
    full = en.mesh_variants(pairs, hw, Pins(), model)
    for idx in en.chunks_by_pp(full):
        part = en._take(full, idx)
        e = estimate_batch(model, hw, cluster, job, en.to_batch(model, job, part))
        assert (row_family_lower[part["row"]] <= e.step_time_s * (1 + 1e-12)).all()
        assert (lower[part["row"]] <= e.step_time_s * (1 + 1e-12))[may_fit[part["row"]]].all()
        assert (pair_lower[part["pair"]] <= e.step_time_s * (1 + 1e-12)).all()
        assert not (e.fits & ~may_fit[part["row"]]).any()


def test_unique_layout_rows_match_numpy_unique():
    """_unique_rows (one mixed-radix integer per row) gives np.unique(axis=0)'s rows, order and inverse,
    including the empty table and columns too wide to pack (numpy's own path)."""
    rng = np.random.default_rng(3)
    for n, high in ((0, 4), (1, 4), (500, 3), (2000, 9), (50, 2 ** 40)):
        cols = rng.integers(0, high, size=(n, 6), dtype=np.int64)
        keys, inverse = en._unique_rows(cols)
        want, want_inverse = np.unique(cols, axis=0, return_inverse=True)
        assert np.array_equal(keys, want) and np.array_equal(inverse, np.asarray(want_inverse).reshape(-1))


def test_price_chunks_cover_every_row_once_within_the_cell_budget():
    """chunks_by_pp: every row in exactly one chunk; a chunk's rows times its largest pp within the cell
    budget (one row alone may exceed it); rows of another pp join a chunk only while their padding stays
    within the allowance; with no allowance, one pp value per chunk."""
    rng = np.random.default_rng(0)
    pp = rng.choice([1, 2, 3, 4, 8, 16, 64], size=5000, p=[0.3, 0.2, 0.05, 0.2, 0.15, 0.08, 0.02])
    rows = {"pp": pp}
    for padding in (0, 2_000, PAD_CELLS, 10 ** 9):
        chunks = list(en.chunks_by_pp(rows, cells=40_000, padding=padding))
        seen = np.concatenate(chunks)
        assert np.array_equal(np.sort(seen), np.arange(len(pp)))
        calls = 0
        for idx in chunks:
            width = int(pp[idx].max())
            assert len(idx) * width <= 40_000 or len(idx) == 1
            assert int((width - pp[idx]).sum()) <= max(padding, 0)
            calls += 1
        if padding == 0:
            assert all(len(np.unique(pp[idx])) == 1 for idx in chunks)
            fewest = calls
    assert calls < fewest


@pytest.mark.parametrize("case", CASES)
def test_what_a_zero_offload_pair_changes_is_only_its_own_parts(case):
    """What the skeleton bound rests on (bound_step_s_without_pairs): on the pair bound's profile, a
    skeleton's step less PAIR_PARTS is the same under every ZeRO/offload pair that keeps the word embedding on
    the device, and the parts it leaves out (contention aside) are never negative; so it is below every
    pair's bound, which is below the real step time (test_bounds_never_exceed_the_real_step_time)."""
    model, hw, cluster, job, rows = _sample(*case, size=200)
    fast = en.fastest_link_hardware(hw, cluster.devices, model.moe is not None)
    n = len(rows["dp"])
    for idx in en.chunks_by_pp(rows):
        common = []
        for zero, offload in ((0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)):
            pair = {**rows, "zero": np.full(n, zero), "offload": np.full(n, offload)}
            part = en._take(pair, idx)
            e = estimate_batch(model, fast, cluster, job, en.to_batch(model, job, part))
            for name in en.PAIR_PARTS[:-1]:
                assert (np.asarray(e.time_s[name]) >= 0.0).all(), name
            common.append(en.bound_step_s_without_pairs(e))
        assert np.allclose(common, common[0], rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("case", CASES)
def test_offloading_the_optimizer_never_slows_a_pair_bound_nor_needs_more_memory(case):
    """What _Scoring._bound_pairs skips on: on the pair bound's profile (fastest links, free host) a ZeRO
    stage with the optimizer on the host runs no longer than the same stage without, and needs no more
    device memory, for every sampled skeleton (so when the offloaded pair cannot fit or reach the limit,
    the pair without offload cannot either)."""
    model, hw, cluster, job, rows = _sample(*case, size=300)
    fast = en.fastest_link_hardware(hw, cluster.devices, model.moe is not None)
    checked = 0
    for zero in (0, 1, 2, 3):
        plain = {**rows, "zero": np.full(len(rows["dp"]), zero), "offload": np.zeros(len(rows["dp"]), dtype=np.int64)}
        offloaded = {**plain, "offload": np.full(len(rows["dp"]), en.OFFLOAD_OPTIMIZER)}
        for idx in en.chunks_by_pp(rows):
            e0, step0 = en.bound_estimate(model, fast, cluster, job, en._take(plain, idx), Pins())
            e1, step1 = en.bound_estimate(model, fast, cluster, job, en._take(offloaded, idx), Pins())
            n = len(idx)
            assert (step1 <= step0).all()
            assert (e1.memory.total[:n] <= e0.memory.total[:n] * (1 + 1e-12)).all()
            checked += n
    assert checked == 4 * len(rows["dp"])


@pytest.mark.parametrize("case", CASES[:3])
def test_memory_does_not_depend_on_the_mesh_order_and_grows_with_the_micro_batch(case):
    model, hw, cluster, job, rows = _sample(*case, size=300)
    orders = en._cross(rows, {"mesh": np.arange(len(en.MESH_ORDERS))})
    for idx in en.chunks_by_pp(orders):
        part = en._take(orders, idx)
        total = memory(model, job, en.to_batch(model, job, part)).total.reshape(-1, len(en.MESH_ORDERS))
        assert np.allclose(total, total[:, :1], rtol=1e-12)
    doubled = {**rows, "mbs": rows["mbs"] * 2, "m": np.maximum(rows["m"] // 2, 1)}
    for idx in en.chunks_by_pp(rows):
        small = memory(model, job, en.to_batch(model, job, en._take(rows, idx))).total
        large = memory(model, job, en.to_batch(model, job, en._take(doubled, idx))).total
        assert (large >= small * (1 - 1e-12)).all()


# ---- vectorized and scalar paths ----------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_enumerated_candidates_estimate_the_same_one_by_one(case):
    """Random enumerated candidates (random ZeRO/offload pairs and mesh orders): estimate_batch on the
    enumerator's arrays equals estimate() on each candidate's Strategy."""
    model, hw, cluster, job, rows = _sample(*case, size=40, seed=1)
    rng = np.random.default_rng(2)
    options = en.zero_offload_options(Pins(), job.framework)
    pairs = en.zero_variants(rows, options)
    full = en.mesh_variants(pairs, hw, Pins(), model)
    pick = np.sort(rng.choice(len(full["dp"]), size=min(40, len(full["dp"])), replace=False))
    sample = en._take(full, pick)
    batch = en.finalist_batch(model, job, sample)
    e = estimate_batch(model, hw, cluster, job, batch)
    for i in range(len(batch)):
        one = estimate(model, hw, cluster, job, batch.strategy(i))
        assert one.step_time_s == pytest.approx(float(e.step_time_s[i]), rel=1e-9)
        assert one.tokens_per_s == pytest.approx(float(e.tokens_per_s[i]), rel=1e-9)
        assert one.mfu == pytest.approx(float(e.mfu[i]), rel=1e-9)
        assert one.memory_gib.total * 2 ** 30 == pytest.approx(float(e.memory.total[i]), rel=1e-9)
        assert one.feasible == bool(e.feasible[i])
        for part, values in e.time_s.items():
            assert one.time_s[part] == pytest.approx(float(values[i]), rel=1e-9, abs=1e-15)
