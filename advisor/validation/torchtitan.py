"""torchtitan's published runs (benchmarks/data/torchtitan_runs.yaml) as CalibrationRuns, held out:
no constant is fitted on them; they test the fitted profiles on FSDP2, float8, long context and the
peak memory torchtitan reports (max reserved).

How a row is read: framework "torchtitan" (FSDP2 over the data-parallel ranks = ZeRO-3, not resharded
under pipeline parallelism; op-level selective checkpointing for "op"; eager kernels unless
torch.compile is on, then fused); Float8 = FP8 tensorwise (torchao) with fp32 gradient reduction;
async TP = tensor-parallel communication overlap; "layer" checkpointing (selective_ac_option "2")
recomputes every second layer in full: half the layers of a stage. FSDP shards over the data-parallel
and context-parallel ranks together (torchtitan's dp_shard_cp mesh), so a row with FSDP 1 and CP 8
is still ZeRO-3 over 8 ranks. Under pipeline parallelism the local batch is split into as many
micro-batches as there are stages (experimental.pipeline_parallel_microbatches defaults to the
pipeline degree at 9dec370, torchtitan/parallelisms/pipelining_utils.py), and the 405B rows gather
FSDP parameters in FP8 (train_configs/llama3_405b.toml: enable_fsdp_float8_all_gather = true).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.model import load_model
from advisor.validation.runs import DATA_DIR, CalibrationRun
from advisor import bundled_yaml

RUNS_FILE = DATA_DIR / "torchtitan_runs.yaml"


def _strategy(row: dict[str, Any], num_layers: int, gbs: int) -> Strategy:
    tp, pp, cp = row.get("tp", 1), row.get("pp", 1), row.get("cp", 1)
    dp = row["fsdp"]
    ac = row["ac"]
    recompute = {"none": "none", "full": "full", "op": "selective", "layer": "full"}[ac]
    schedule = row.get("schedule", "1f1b")
    vpp = 2 if schedule == "interleaved-1f1b" else 1
    layers = None
    if ac == "layer":
        layers = max(num_layers // pp // 2, 1)
    mbs = row["local_batch"] // pp if pp > 1 else row["local_batch"]   # pp micro-batches per local batch
    return Strategy(dp=dp, tp=tp, pp=pp, cp=cp, sequence_parallel=tp > 1, micro_batch_size=mbs,
                    num_micro_batches=gbs // (dp * mbs), zero_stage=3 if dp * cp > 1 else 0, recompute=recompute,
                    recompute_layers=layers, pipeline_schedule=schedule, virtual_pipeline_stages=vpp)


def _run(row: dict[str, Any], hardware: dict[str, Any]) -> CalibrationRun:
    model = load_model(row["model"])
    hw = hardware[row["hardware"]]
    gbs = row["local_batch"] * row["fsdp"]
    job = TrainingJob(
        global_batch_size=gbs, seq_length=row["seq"], dtype="fp8" if row["float8"] else "bf16",
        fp8_recipe="tensorwise" if row["float8"] else None, framework="torchtitan",
        fused_kernels=bool(row["compile"]), tp_comm_overlap=bool(row.get("async_tp")), grad_reduce_dtype="fp32",
        fp8_param_gather=bool(row["float8"] and row.get("fp8_all_gather")),
    )
    overrides = tuple(sorted((k, v) for k, v in hw.items() if k in ("memory_gib", "memory_bandwidth_gbps")))
    measured = row["measured"]
    return CalibrationRun(
        id=row["id"], source="torchtitan", profile=hw["profile"], devices=row["devices"], model=model, job=job,
        strategy=_strategy(row, model.num_layers, gbs),
        measured_tokens_per_s_per_device=float(measured["tokens_per_s_per_device"]),
        features=frozenset(f for f, on in (("FP8", row["float8"]), ("FSDP/ZeRO-3", row["fsdp"] > 1),
                                          ("context parallel", row.get("cp", 1) > 1),
                                          ("long context (>= 16k)", row["seq"] >= 16384)) if on),
        measured_peak_memory_gib=measured.get("peak_reserved_gib"), hardware_overrides=overrides,
    )


@lru_cache(maxsize=1)
def load_torchtitan_runs(path: Path | None = None) -> tuple[CalibrationRun, ...]:
    data = bundled_yaml.load(path or RUNS_FILE)
    return tuple(_run(row, data["hardware"]) for row in data["runs"])
