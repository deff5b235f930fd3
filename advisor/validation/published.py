"""Measured runs from public sources, and the cost model's prediction of each.

Used by benchmarks/accuracy.py (figures) and tests/test_golden.py (thresholds). The data files are
copied under benchmarks/data/ with their sources (see the README there).

Settings a paper did not state are chosen the way a tuned run would choose them and the choice is
documented here: for Narayanan et al. SC'21 Table 1 the micro-batch size and whether the pipeline is
interleaved are not given per row, so each row takes the best predicted among micro-batch sizes
1, 2, 4, 8 and, for pp > 1, the plain and the interleaved 1F1B schedule (virtual stages dividing
the layers per stage). vTrain's rows do not state recomputation or vocabulary: Megatron-LM's
defaults are used (no recomputation; the GPT-2 vocabulary of 50,257 padded to 51,200 is assumed). Both sources ran Megatron-LM's unfused
("math") attention with Megatron's default dropout, so the runs are predicted with attention="math",
dropout=True.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from advisor.cost.estimate import estimate
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec, model_from_dict
from advisor import bundled_yaml

DATA_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
HARDWARE_FOR = {"selene-a100-80g": "dgx-a100-80g"}


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source: str
    model: ModelSpec
    hardware: str
    devices: int
    job: TrainingJob
    parallel: dict[str, Any]
    measured: dict[str, float]
    micro_batch_size: int | None = None   # None where the source does not state it


def _gpt(raw: dict[str, Any], seq: int, name: str) -> ModelSpec:
    data = {
        "name": name, "source": "published run", "seq_length": seq, "ffn_activation": "gelu",
        "norm": "layernorm", "use_bias": True, "position_embedding": "learned", "tie_embeddings": True,
        **raw,
    }
    return model_from_dict(data, name)


def load_published_runs(path: Path | None = None) -> list[PublishedRun]:
    data = bundled_yaml.load(path or DATA_DIR / "published_runs.yaml")
    runs = []
    for r in data["runs"]:
        tr = r["training"]
        runs.append(PublishedRun(
            id=r["id"], source=r["source"], model=_gpt(r["model"], tr["seq"], r["id"]),
            hardware=HARDWARE_FOR[r["hardware"]], devices=r["devices"],
            # Megatron-LM of 2021-22 used unfused ("math") attention.
            job=TrainingJob(global_batch_size=tr["gbs"], seq_length=tr["seq"], dtype=tr.get("dtype", "fp16"),
                            attention="math", dropout=True),
            parallel=r["parallel"], measured=r["measured"], micro_batch_size=tr.get("mbs"),
        ))
    return runs


def _strategy(run: PublishedRun, mbs: int, vpp: int) -> Strategy:
    p = run.parallel
    dp, tp, pp = p["dp"], p["tp"], p["pp"]
    return Strategy(
        dp=dp, tp=tp, pp=pp, sequence_parallel=p.get("sequence_parallel", False),
        virtual_pipeline_stages=vpp, micro_batch_size=mbs,
        num_micro_batches=run.job.global_batch_size // (dp * mbs),
        recompute=p.get("recompute", "none"),
        pipeline_schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
    )


def candidate_strategies(run: PublishedRun) -> list[Strategy]:
    """The published configuration; unstated micro-batch size / interleaving enumerated (see doc)."""
    p = run.parallel
    mbs_options = [run.micro_batch_size] if run.micro_batch_size else [m for m in (1, 2, 4, 8) if run.job.global_batch_size % (p["dp"] * m) == 0]
    if p["pp"] == 1:
        vpp_options = [1]
    elif "virtual_pipeline_stages" in p:
        vpp_options = [p["virtual_pipeline_stages"]]
    else:
        per_stage = run.model.num_layers // p["pp"]
        vpp_options = [v for v in range(1, per_stage + 1) if per_stage % v == 0 and v <= 8]
    out = []
    for mbs in mbs_options:
        for v in vpp_options:
            s = _strategy(run, mbs, v)
            if v > 1 and s.num_micro_batches % s.pp:
                continue
            out.append(s)
    return out


@dataclass(frozen=True)
class Prediction:
    run: PublishedRun
    strategy: Strategy
    step_time_s: float
    mfu: float
    feasible: bool


def predict(run: PublishedRun, hardware: HardwareProfile | None = None) -> Prediction:
    hw = hardware or load_hardware(run.hardware)
    cluster = Cluster.of(hw, devices=run.devices)
    best = None
    for s in candidate_strategies(run):
        e = estimate(run.model, hw, cluster, run.job, s)
        if best is None or e.step_time_s < best[1].step_time_s:
            best = (s, e)
    s, e = best
    return Prediction(run=run, strategy=s, step_time_s=e.step_time_s, mfu=e.mfu, feasible=e.feasible)


# ---- vTrain ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VTrainRow:
    gpus: int
    gbs: int
    mbs: int
    hidden: int
    heads: int
    layers: int
    seq: int
    tp: int
    dp: int
    pp: int
    time_s: float


def load_vtrain(path: Path | None = None) -> list[VTrainRow]:
    rows = []
    with open(path or DATA_DIR / "vtrain_single_node.csv") as fh:
        reader = csv.reader(fh)
        next(reader)
        for r in reader:
            if not r or r[0].startswith("#"):
                continue
            vals = [int(x) for x in r[:10]]
            rows.append(VTrainRow(*vals, time_s=float(r[10]) / 1000.0))
    return rows


def vtrain_prediction(row: VTrainRow, hw: HardwareProfile) -> float:
    model = model_from_dict({
        "name": f"gpt-{row.hidden}x{row.layers}", "source": "vTrain single node", "num_layers": row.layers,
        "hidden_size": row.hidden, "num_attention_heads": row.heads, "vocab_size": 51200,
        "seq_length": row.seq, "use_bias": True, "position_embedding": "learned", "tie_embeddings": True,
    }, "vtrain")
    job = TrainingJob(global_batch_size=row.gbs, seq_length=row.seq, dtype="fp16", attention="math", dropout=True)
    s = Strategy(dp=row.dp, tp=row.tp, pp=row.pp, micro_batch_size=row.mbs,
                 num_micro_batches=row.gbs // (row.dp * row.mbs))
    return estimate(model, hw, Cluster.of(hw, devices=row.gpus), job, s).step_time_s


# ---- accuracy summaries (benchmarks/accuracy.py prints them; tests/test_golden.py checks them) ----
@dataclass(frozen=True)
class RunError:
    run_id: str
    measured: float
    predicted: float
    metric: str             # "iteration_time_s" or "hfu_tflops"

    @property
    def relative_error(self) -> float:
        return self.predicted / self.measured - 1.0


def sc21_flops_per_step(run: PublishedRun) -> float:
    """FLOPs of one iteration as SC'21 counts them for its "achieved TFLOP/s" (Narayanan et al. 2021,
    eq. 3, full activation recomputation): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)). Comparing on the
    paper's own count makes the error independent of how advisor counts FLOPs."""
    m = run.model
    b, s, l, h, v = run.job.global_batch_size, run.job.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))


def measured_step_time_s(run: PublishedRun) -> float:
    """The run's iteration time: measured (Korthikanti), or what SC'21's TFLOP/s per GPU implies on
    the paper's own FLOP count."""
    if "iteration_time_s" in run.measured:
        return run.measured["iteration_time_s"]
    return sc21_flops_per_step(run) / (run.measured["hfu_tflops"] * 1e12 * run.devices)


def paper_source(run: PublishedRun) -> str:
    """The source label a paper run is reported under."""
    return "Korthikanti A100" if run.id.startswith("korthikanti") else "SC'21 A100"


def published_errors(hardware: HardwareProfile | None = None) -> list[RunError]:
    """One RunError per published run: iteration time where measured, else TFLOP/s per GPU (the
    paper's FLOP count over the predicted iteration time)."""
    out = []
    for run in load_published_runs():
        pred = predict(run, hardware)
        if "iteration_time_s" in run.measured:
            out.append(RunError(run.id, run.measured["iteration_time_s"], pred.step_time_s, "iteration_time_s"))
        else:
            predicted = sc21_flops_per_step(run) / pred.step_time_s / run.devices / 1e12
            out.append(RunError(run.id, run.measured["hfu_tflops"], predicted, "hfu_tflops"))
    return out


@dataclass(frozen=True)
class RankingScore:
    gpus: int
    hidden: int
    layers: int
    configurations: int
    kendall_tau: float
    best_in_top3: bool


def vtrain_ranking(hardware: HardwareProfile | None = None) -> list[RankingScore]:
    """Per (model, GPU count) group of the vTrain data: Kendall tau of predicted vs measured step
    times, and whether the measured-best configuration is among the predicted top 3."""
    import numpy as np
    from scipy.stats import kendalltau

    hw = hardware or load_hardware("dgx-a100-80g")
    groups: dict[tuple[int, int, int, int], list[VTrainRow]] = {}
    for row in load_vtrain():
        groups.setdefault((row.gpus, row.hidden, row.layers, row.seq), []).append(row)
    scores = []
    for (gpus, hidden, layers, _seq), rows in sorted(groups.items()):
        measured = np.array([r.time_s for r in rows])
        predicted = np.array([vtrain_prediction(r, hw) for r in rows])
        best = int(np.argmin(measured))
        scores.append(RankingScore(
            gpus=gpus, hidden=hidden, layers=layers, configurations=len(rows),
            kendall_tau=float(kendalltau(measured, predicted).statistic),
            best_in_top3=best in np.argsort(predicted, kind="stable")[:3],
        ))
    return scores
