"""Reference executor: run a plan on PyTorch's own distributed stack and measure it.

It reads only the plan JSON (plain dicts; never advisor.cost or advisor.search), builds a GPT-style
model of the plan's family (or its ``--tiny`` shrink) and trains it with exactly the plan's
parallelism: DeviceMesh in the plan's mesh order, FSDP2 ``fully_shard`` (ZeRO-2/3), replicated data
parallelism with an element-wise sharded optimizer (ZeRO-0/1), ``parallelize_module`` tensor and
sequence parallelism with a vocabulary-parallel loss, ``torch.distributed.pipelining`` schedules
with the plan's stage layers and virtual stages, and non-reentrant activation checkpointing. Gloo on
CPU, NCCL on CUDA, one process per device; context parallelism as ring attention or all-to-alls
(ulysses), bf16 mixed precision, the optimizer (or a share of it) and the parameters offloaded, swapped
layers (swap), multi-copy (model.Block), a host-placed word embedding. What it cannot run (expert
parallelism and MoE, operator layouts; config.unrun_settings) is refused up front, by name.

Modules: config (plan -> RunConfig, refusals, --tiny), model, data, parallel, measure (memory by
part), swap (swapped layers), context_parallel and ulysses (the two kinds of context parallelism), train
(one run on one rank; the single-process reference), worker (the per-rank entry point), launch (the
runs for local worker processes; the processes themselves, with their own sessions, hard deadline and
no orphans, are advisor.runtime.launch), host_probe (the host-speed probe, also measured by advisor
calibrate), matrix (the validation plans). advisor.commands.execute compares the results with
advisor's prediction.

One machine::

    advisor execute plan.json [--nproc N] [--steps 5] [--tiny] [--hardware PROFILE.yaml] [--json] [--out report.json]

Several machines (the same entry point under torchrun; every node runs the same command, the
results land in the shared --out-dir, rank 0 gathers them into results.json)::

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --rdzv-backend c10d --rdzv-endpoint $MASTER_HOST:29500 --rdzv-id plan1 \\
        -m advisor.executor.worker --plan plan.json --tiny --steps 5 --out-dir /shared/plan1
    advisor execute plan.json --tiny --steps 5 --results /shared/plan1      # compare and report

With CUDA the worker picks NCCL and ``cuda:LOCAL_RANK`` (``--backend gloo|nccl`` to force one).
"""
