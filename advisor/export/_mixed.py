"""Plans on a mixed cluster (advisor.cost.mixed) in the launchers' terms.

A pipeline cut between device types is an ordinary pipeline with uneven stages: every target that
writes per-stage layer counts writes it, and the ranks of the first stages must land on the first
type's nodes (the launch order: hostfile, MASTER/NODE_RANK, msrun's node_rank, the rank table).
What no target expresses is refused in one sentence: replicas running different shares of the global
batch (Megatron-LM, DeepSpeed, torchtitan and MindSpore all give each data-parallel rank
global batch / dp), and one Kubernetes job over two node types (a PyTorchJob's or MSJob's workers
share one pod template, so one node selector and one device resource).
"""

from __future__ import annotations

from itertools import groupby

from advisor.errors import AdvisorError
from advisor.plan import Plan


def check_mixed(plan: Plan, target: str) -> tuple[str, ...]:
    """Notes for a mixed pipeline plan's export; AdvisorError where the target cannot express it."""
    if plan.mixed is None:
        return ()
    if plan.layout.kind != "pipeline":
        raise AdvisorError(f"the plan splits the global batch unevenly between data-parallel replicas on "
                           f"{plan.mixed.label} (dp_batch_split); {target} gives every replica the same share, so it "
                           f"cannot run this plan: export a plan whose layout is 'pipeline' (recommend's layout column)")
    if target == "k8s":
        raise AdvisorError(f"a Kubernetes job's workers share one pod template (one node selector and device "
                           f"resource), so one job cannot span {plan.mixed.label}; export to a launcher and start "
                           "each node type's pods with its own selector")
    runs, start, per_stage = [], 0, plan.strategy.devices // plan.strategy.pp
    for name, run in groupby(plan.layout.stage_devices):
        n = len(list(run))
        nodes = plan.mixed.part(name).nodes
        runs.append(f"ranks {start * per_stage}-{(start + n) * per_stage - 1} (stages {start}-{start + n - 1}) on "
                    f"the {nodes} {name} nodes")
        start += n
    return ("mixed cluster: start the nodes in this order (node rank, hostfile or rank table order): "
            + "; ".join(runs) + "; the stages' layer counts were sized to each type's speed and memory",)
