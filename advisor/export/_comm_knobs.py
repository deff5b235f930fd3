"""The plan's communication-fusion bucket size and multi-copy count, as each target writes them.

* Megatron-LM: --ddp-bucket-size, "maximum number of parameters in each bucket"
  (megatron/training/arguments.py; DistributedDataParallelConfig.bucket_size, present in every
  supported Megatron-Core release): the plan's bucket bytes over the bytes a gradient is reduced in.
* DeepSpeed: zero_optimization.reduce_bucket_size / allgather_bucket_size, in elements
  (deepspeed/runtime/zero/config.py): the gradients' and the gathered weights' element counts. Stage 0
  all-reduces through a fixed 5e8-element buffer (engine.py MEMORY_OPT_ALLREDUCE_SIZE): reported.
* MindSpore: set_auto_parallel_context(comm_fusion={op: {"mode": "size", "config": MB}}) for the
  data-parallel collectives (allreduce; with the optimizer parallel reducescatter and allgather),
  MB an integer (docs mirror tutorials/source_en/parallel/comm_fusion.md).
* Multi-copy: MindFormers' top-level micro_batch_interleave_num (mindformers/tools/register/template.py)
  with runner_config.batch_size per copy (base_trainer.py: global batch = batch_size x dp x
  micro_batch_num x micro_batch_interleave_num). The other targets have no such switch: reported.
"""

from __future__ import annotations

from advisor.cost.fusion import MIB
from advisor.plan import Plan


def bucket_bytes(plan: Plan) -> float | None:
    mb = plan.strategy.grad_bucket_mb
    return None if mb is None else mb * MIB


def megatron_flags(plan: Plan) -> list[str]:
    size = bucket_bytes(plan)
    if size is None:
        return []
    return ["--ddp-bucket-size", str(max(int(round(size / plan.training.grad_reduce_bytes)), 1))]


def deepspeed_keys(plan: Plan, weight_bytes: float, unsupported: list[str]) -> dict:
    size = bucket_bytes(plan)
    if size is None:
        return {}
    if plan.strategy.zero_stage == 0:
        unsupported.append(f"parallel.grad_bucket_mb = {plan.strategy.grad_bucket_mb:g}: DeepSpeed's stage 0 all-reduces "
                           "gradients through a fixed 5e8-element buffer (engine.py MEMORY_OPT_ALLREDUCE_SIZE); not set")
        return {}
    return {"reduce_bucket_size": max(int(round(size / plan.training.grad_reduce_bytes)), 1),
            "allgather_bucket_size": max(int(round(size / weight_bytes)), 1)}


def mindspore_comm_fusion(plan: Plan) -> dict | None:
    mb = plan.strategy.grad_bucket_mb
    if mb is None:
        return None
    size = {"mode": "size", "config": max(int(round(mb)), 1)}
    if plan.strategy.zero_stage >= 1:
        return {"reducescatter": dict(size), "allgather": dict(size)}
    return {"allreduce": dict(size)}


def copies_unsupported(plan: Plan, target: str, closest: str) -> str | None:
    k = plan.strategy.micro_batch_copies
    if k == 1:
        return None
    return (f"parallel.micro_batch_copies = {k}: {target} has no multi-copy (micro-batch interleave) switch; "
            f"exported without it (closest: {closest})")


def torchtitan_bucket_unsupported(plan: Plan) -> str | None:
    mb = plan.strategy.grad_bucket_mb
    if mb is None:
        return None
    return (f"parallel.grad_bucket_mb = {mb:g}: torchtitan's job config has no gradient bucket size; exported with "
            "its default")


def priority_unsupported(plan: Plan, target: str) -> str | None:
    """training.comm_priority (advisor.cost.contention): no launcher schedules bytes on a link by priority."""
    if not plan.training.comm_priority:
        return None
    return (f"training.comm_priority = true: {target} has no switch that lets the layers' transfers go ahead of "
            "data-parallel traffic on a shared link (Megatron-Core's high_priority_stream_groups orders kernels on "
            "the device, not bytes on a link); exported without it, and the plan's step time assumes it")


def full_batch_unsupported(plan: Plan, target: str) -> str | None:
    """parallel.full_batch (advisor.cost.dataset): only MindSpore reads the whole batch on every rank."""
    if not plan.strategy.full_batch:
        return None
    return (f"parallel.full_batch = true: {target}'s data loader gives each data-parallel rank its own shard of the "
            "global batch; exported that way (it reads less than the plan was priced with)")


def host_embedding_unsupported(plan: Plan, target: str) -> str | None:
    """parallel.host_embedding (advisor.cost.host_embedding): MindSpore's Host&Device switch."""
    if not plan.strategy.host_embedding:
        return None
    return (f"parallel.host_embedding = true: {target} has no switch that runs the word-embedding lookup and its "
            "optimizer on the host CPU; exported with the table on the devices, which needs more device memory "
            "than the plan was priced with")


def cuda_graphs_unsupported(plan: Plan, target: str) -> str | None:
    """training.cuda_graphs (advisor.cost.cuda_graphs): Megatron-Core's per-layer CUDA graphs."""
    if not plan.training.cuda_graphs:
        return None
    return (f"training.cuda_graphs = {', '.join(plan.training.cuda_graphs)}: {target} has no per-layer CUDA graphs of "
            "Megatron-Core's kind; exported without them (the plan's host time was priced with them)")


def token_drop_unsupported(plan: Plan, target: str) -> str | None:
    """training.moe_dropless = false: a capacity factor with padding (Megatron's and MindSpore's)."""
    if plan.training.moe_dropless or plan.model.moe is None:
        return None
    return (f"training.moe_dropless = false: {target} has no capacity factor with padding for its experts; exported "
            "dropless (the plan was priced without the host synchronization dropless routing pays)")
