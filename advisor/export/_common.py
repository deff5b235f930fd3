"""What every exporter needs from a plan: processes per node, chunk layouts, step counts, a header."""

from __future__ import annotations

import math

from advisor.errors import AdvisorError
from advisor.plan import Plan
from advisor.space.strategy import DEFAULT_MESH_ORDER

def device_resource(plan: Plan) -> str:
    """The extended resource a device plugin advertises for the plan's accelerator."""
    name = plan.hardware.device.name.lower()
    if "ascend" in name:
        return "huawei.com/Ascend910"
    return "nvidia.com/gpu"


DTYPE_TORCH = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32", "fp8": "bfloat16"}


def procs_per_node(plan: Plan, target: str, unsupported: list[str]) -> int:
    """Processes per node for a launcher that starts the same number on every node (torchrun)."""
    nodes, devices = plan.cluster.nodes, plan.cluster.devices
    per_node = plan.hardware.node.devices_per_node
    if devices % nodes:
        unsupported.append(
            f"cluster.devices = {devices} on {nodes} nodes: {target} starts the same number of processes on every "
            f"node; exported with {per_node} per node ({nodes * per_node} processes), adjust the degrees before launching")
        return per_node
    return devices // nodes


def chunk_layers(plan: Plan) -> list[list[int]]:
    """Transformer layers of each model chunk, [virtual stage][pipeline stage]. A physical stage with
    L layers holds vpp chunks of L // vpp layers; a remainder goes one layer each to the chunks away from the
    embedding (the first stage's last chunks) and the loss (the other stages' first chunks), as Megatron's
    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split recipes place them."""
    s = plan.strategy
    stages = s.resolved_stage_layers(plan.model.num_layers)
    v = s.virtual_pipeline_stages
    rows = [[n // v for n in stages] for _ in range(v)]
    for p, n in enumerate(stages):
        extra = n % v
        chunks = range(v - extra, v) if p == 0 else range(extra)
        for c in chunks:
            rows[c][p] += 1
    return rows


def stage_layers(plan: Plan) -> tuple[int, ...]:
    return tuple(plan.strategy.resolved_stage_layers(plan.model.num_layers))


def is_even_split(plan: Plan) -> bool:
    layers = stage_layers(plan)
    return len(set(layers)) == 1


def train_steps(plan: Plan) -> int | None:
    """Optimizer steps to consume the plan's token budget (None when it has none)."""
    tokens = plan.training.train_tokens
    if tokens is None:
        return None
    return max(1, math.ceil(tokens / plan.training.tokens_per_step))


def non_default_mesh(plan: Plan) -> bool:
    """The mesh order differs from tp innermost, then cp, dp, pp outermost, in a way that matters
    (a dimension of degree 1 can sit anywhere)."""
    s = plan.strategy
    active = [d for d in s.mesh_order if s.degree(d) > 1]
    default = [d for d in DEFAULT_MESH_ORDER if s.degree(d) > 1]
    return active != default


def mesh_text(plan: Plan) -> str:
    return " > ".join(plan.strategy.mesh_order) + " (outermost to innermost)"


def display(text: str) -> str:
    """A plan string made safe for one line of a comment or a message: every character that is not
    printable (newlines, carriage returns, NUL, escape sequences, Unicode line separators) is written
    as its Python escape, so no name can end a comment line and become code in an export."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def pick_version(target: str, requested: str | None, supported: tuple[str, ...], default: str) -> str:
    """The target release an export writes for: `requested` when it is one of `supported`, else `default`."""
    if requested is None:
        return default
    if requested not in supported:
        raise AdvisorError(f"--target-version: the {target} export supports {', '.join(supported)} "
                           f"(default {default}), not {display(requested[:20])!r}")
    return requested


def header_lines(plan: Plan, target: str) -> list[str]:
    """A few comment lines: what the plan is and what it predicts. Names go through display()."""
    s, m, c, j = plan.strategy, plan.model, plan.cluster, plan.training
    lines = [
        f"advisor plan -> {target} (advisor {display(plan.advisor_version)})",
        f"model {display(m.name)} on {c.devices} x {display(plan.hardware.device.name)} ({c.nodes} nodes, "
        f"profile {display(plan.hardware.name)})",
        f"dp={s.dp} tp={s.tp} pp={s.pp} cp={s.cp} ep={s.ep} sp={'on' if s.sequence_parallel else 'off'} "
        f"vpp={s.virtual_pipeline_stages} zero={s.zero_stage} recompute={s.recompute} schedule={s.pipeline_schedule}",
        f"global batch {j.global_batch_size} x seq {j.seq_length} = micro-batch {s.micro_batch_size} x "
        f"{s.num_micro_batches} micro-batches x dp {s.dp}; dtype {j.dtype}",
    ]
    pred = plan.prediction or {}
    if pred.get("tokens_per_s"):
        mfu = pred.get("mfu")
        lines.append(f"predicted: {pred['tokens_per_s']:,.0f} tokens/s, step {pred.get('step_time_s', 0.0):.3f} s"
                     + (f", MFU {mfu:.1%}" if isinstance(mfu, (int, float)) else ""))
    return lines


def comment_block(lines: list[str], prefix: str = "# ") -> str:
    return "".join(f"{prefix}{display(line)}\n" for line in lines)


# the model keys an export may leave unwritten (unwritten_model_features)
MODEL_FEATURES = ("head_dim", "mla", "moe.num_shared_experts", "moe.first_k_dense_layers", "sliding_window")


# the model keys unwritten_model_features checks (an export that writes the whole architecture passes them all)
ALL_FEATURES = ("head_dim", "mla", "moe.num_shared_experts", "moe.first_k_dense_layers", "sliding_window")


def unwritten_model_features(plan: Plan, target: str, written: tuple[str, ...] = ()) -> list[str]:
    """The unsupported-feature sentences for the model keys an export does not write (all but those
    named in `written`): the model would silently train as another architecture otherwise."""
    m = plan.model
    present = {
        "head_dim": m.head_dim_override is not None,
        "mla": m.mla is not None,
        "moe.num_shared_experts": m.moe is not None and m.moe.num_shared_experts > 0,
        "moe.first_k_dense_layers": m.moe is not None and m.moe.first_k_dense_layers > 0,
        "sliding_window": m.sliding_window is not None,
    }
    return [f"model.{key}: the {target} export does not write it; set it in the model code or config by hand"
            for key, on in present.items() if on and key not in written]
