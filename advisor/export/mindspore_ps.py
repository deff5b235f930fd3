"""MindSpore for recommendation plans: parameter-server (ps), hybrid and collective-only.

A PS or hybrid plan becomes (MindSpore "Parameter Server Training" tutorial, r2.x; the Wide&Deep
model zoo script train_and_eval_parameter_server_distribute.py; ms-operator's PS samples):

* ``ps_context.py``: ``mindspore.set_ps_context(enable_ps=True)``; for hybrid, workers all-reduce
  what the servers do not hold (``set_auto_parallel_context(parallel_mode="data_parallel",
  gradients_mean=True)`` after ``init()``); ``place_on_servers(network)`` calls
  ``Parameter.set_param_ps()`` on the parameters of the plan's server tensors (names are matched
  against the model description's table names and ``bottom_mlp_i`` / ``top_mlp_i``) and refuses to
  run when one of them is not found, so a plan never trains silently without its servers;
* ``run_scheduler.sh``, ``run_server.sh``, ``run_worker.sh``: one start script per role with the
  role environment (MS_ROLE = MS_SCHED / MS_PSERVER / MS_WORKER, MS_SERVER_NUM, MS_WORKER_NUM,
  MS_SCHED_HOST, MS_SCHED_PORT); the worker script starts one process per local device.

MindSpore's parameter-server API ends at 2.7: ``Parameter.set_param_ps`` and ``Cell.set_param_ps``
are in the released mindspore 2.7.0 wheel (mindspore/common/parameter.py, nn/cell.py) and in none
of 2.8.0, 2.9.0 and 2.10.0 (``set_ps_context`` remains, marked for removal). The export is written
for MindSpore <= 2.7 (LAST_PS_VERSION); a newer --target-version is reported, and
``place_on_servers`` stops with that sentence on a MindSpore without ``set_param_ps``.

A collective-only plan writes ``ps_context.py`` with the data-parallel context (replicated tables) or
semi-auto parallel with row-sliced tables (sharded, nn.EmbeddingLookup slice_mode TABLE_ROW_SLICE);
a host plan (Host&Device heterogeneous: tutorials/source_en/parallel/host_device_training.md) the
data-parallel context and ``place_on_host(network)``, which sets the host tables' lookup primitives
to run on the CPU (``Primitive.set_device("CPU")``) and splits the parameters for a host optimizer
(``optimizer.target = "CPU"``) and a device one.
Only numbers and validated identifiers from the plan reach code, through repr(); comments go
through _common.display; the scripts take the training script and scheduler address from the
environment, never from the plan.
"""

from __future__ import annotations

import re

from advisor.export import ExportResult
from advisor.export._common import display
from advisor.plan import Plan

DEFAULT_SCHED_PORT = 8081            # any free port; every role must use the same (MindSpore PS tutorial)
LAST_PS_VERSION = (2, 7)             # the last MindSpore release with Parameter.set_param_ps (module doc)


def asynchronous_unsupported(plan: Plan) -> list[str]:
    """The sentences for what MindSpore's parameter-server training cannot run of a plan's servers. It has no
    asynchronous mode and keeps no replica of a server's shard: set_ps_context takes enable_ps,
    config_file_path, scheduler_manage_port, enable_ssl and the two passwords (mindspore.set_ps_context API
    reference r1.8-r2.5; nothing selects asynchronous updates or replication), so the job it launches waits
    for every worker each step, and a server it loses ends it."""
    ps = plan.parameter_server
    out = []
    if ps is not None and not ps["synchronous"]:
        out.append("parallel.parameter_server.synchronous = false: MindSpore's parameter-server training has no "
                   "asynchronous mode (set_ps_context: enable_ps, config_file_path, scheduler_manage_port, "
                   "enable_ssl); the job would run synchronously, which is not the plan priced: re-plan without "
                   "--ps-async")
    if ps is not None and ps.get("replicas", 0):
        out.append("parallel.parameter_server.replicas = 1: MindSpore's parameter server keeps no copy of a server's "
                   "shard (set_ps_context has no replication setting), so the job would run without the priced "
                   "replication and end when a server fails: re-plan with --ps-replicas 0")
    return out


def _version(text: str) -> tuple[int, ...] | None:
    """(major, minor) of a version such as 2.8, v2.8.0, r2.8 or 2.8rc1; None when there is none."""
    found = re.search(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _header(plan: Plan) -> list[str]:
    ps = plan.parameter_server
    lines = [f"advisor plan -> MindSpore (advisor {display(plan.advisor_version)})",
             f"model {display(plan.model.name)} on {plan.cluster.devices} x {display(plan.hardware.device.name)} "
             f"({plan.cluster.nodes} nodes), global batch {plan.training.global_batch_size}"]
    if ps is not None:
        lines.append(f"{ps['mode']} parameter server, {'synchronous' if ps['synchronous'] else 'asynchronous'}, "
                     f"{ps['servers']} {ps['server_placement']} servers, {len(ps['tensors'])} tensors on servers")
    elif plan.embedding_placement == "host":
        lines.append(f"Host&Device heterogeneous: {len(plan.host_tables or plan.model.tables)} embedding tables in "
                     "host memory, the rest data parallel on the devices")
    else:
        lines.append(f"collective only: embedding tables {display(plan.embedding_placement or 'replicated')}")
    pred = plan.prediction or {}
    if isinstance(pred.get("samples_per_s"), (int, float)):
        lines.append(f"predicted: {pred['samples_per_s']:,.0f} samples/s")
    return lines


def context_script(plan: Plan) -> str:
    ps = plan.parameter_server
    head = "".join(f"# {line}\n" for line in _header(plan))
    if ps is None and plan.embedding_placement == "host":
        return head + _host_script(plan)
    if ps is None:
        sharded = plan.embedding_placement == "sharded"
        mode = "semi_auto_parallel" if sharded else "data_parallel"
        return (head + "import mindspore as ms\nfrom mindspore.communication import init\n\n"
                "ms.set_context(mode=ms.GRAPH_MODE)\ninit()\n"
                f"ms.set_auto_parallel_context(parallel_mode={mode!r}, gradients_mean=True, "
                f"device_num={plan.cluster.devices!r})\n"
                + ("# shard the tables by rows: nn.EmbeddingLookup(..., slice_mode=nn.EmbeddingLookup.TABLE_ROW_SLICE)\n"
                   if sharded else ""))
    hybrid = ps["mode"] == "hybrid"
    lines = [head, "import os\n\nimport mindspore as ms\n\n",
             f"SERVER_TENSORS = {list(ps['tensors'])!r}\n",
             f"SERVER_SHARDING = {dict(ps['sharding'])!r}   # tensor -> servers (rows split evenly)\n\n",
             "ms.set_context(mode=ms.GRAPH_MODE)\n",
             "ms.set_ps_context(enable_ps=True)\n"]
    if hybrid:
        lines += ["if os.environ.get('MS_ROLE') == 'MS_WORKER':\n",
                  "    from mindspore.communication import init\n\n",
                  "    init()\n",
                  "    # what the servers do not hold is trained data parallel among the workers\n",
                  f"    ms.set_auto_parallel_context(parallel_mode='data_parallel', gradients_mean=True, "
                  f"device_num={plan.cluster.devices!r})\n"]
    lines += ["\n\n",
              "def place_on_servers(network):\n",
              "    \"\"\"set_param_ps() on every parameter of the plan's server tensors; fails on a missing one.\"\"\"\n",
              "    found = set()\n",
              "    if not hasattr(ms.Parameter, 'set_param_ps'):\n",
              "        raise RuntimeError(f'MindSpore {ms.__version__} has no Parameter.set_param_ps: parameter-server '\n",
              "                           'training needs MindSpore 2.7 or older')\n",
              "    for param in network.trainable_params():\n",
              "        parts = set(param.name.replace('/', '.').split('.'))\n",
              "        for tensor in SERVER_TENSORS:\n",
              "            if tensor in parts:\n",
              "                param.set_param_ps()\n",
              "                found.add(tensor)\n",
              "    missing = [t for t in SERVER_TENSORS if t not in found]\n",
              "    if missing:\n",
              "        raise RuntimeError(f'no parameter of the network is named after server tensors {missing}')\n",
              "    return network\n"]
    return "".join(lines)


def _host_script(plan: Plan) -> str:
    """Host&Device heterogeneous training (MindSpore tutorial "Host&Device Heterogeneous"): the plan's
    host tables looked up on the CPU (Primitive.set_device("CPU")) and updated by an optimizer whose
    target is "CPU"; everything else data parallel on the devices."""
    tables = list(plan.host_tables or [t.name for t in plan.model.tables])
    return ("import mindspore as ms\nfrom mindspore.communication import init\n\n"
            f"HOST_TABLES = {tables!r}\n\n"
            "ms.set_context(mode=ms.GRAPH_MODE)\ninit()\n"
            f"ms.set_auto_parallel_context(parallel_mode='data_parallel', gradients_mean=True, "
            f"device_num={plan.cluster.devices!r})\n\n\n"
            "def _named(name):\n"
            "    parts = set(name.replace('/', '.').split('.'))\n"
            "    return [t for t in HOST_TABLES if t in parts]\n\n\n"
            "def place_on_host(network):\n"
            "    \"\"\"Run the lookups of the host tables on the CPU; returns (host parameters, device parameters)\n"
            "    for two optimizers, the first with optimizer.target = 'CPU'. Fails on a missing table.\"\"\"\n"
            "    for name, cell in network.cells_and_names():\n"
            "        if _named(name):\n"
            "            for attr in vars(cell).values():\n"
            "                if isinstance(attr, ms.ops.Primitive):\n"
            "                    attr.set_device('CPU')\n"
            "    host, device, found = [], [], set()\n"
            "    for param in network.trainable_params():\n"
            "        tables = _named(param.name)\n"
            "        found.update(tables)\n"
            "        (host if tables else device).append(param)\n"
            "    missing = [t for t in HOST_TABLES if t not in found]\n"
            "    if missing:\n"
            "        raise RuntimeError(f'no parameter of the network is named after host tables {missing}')\n"
            "    return host, device\n")


def _script(plan: Plan, role: str, body: str) -> str:
    ps = plan.parameter_server
    head = "".join(f"# {line}\n" for line in _header(plan))
    return ("#!/usr/bin/env bash\n" + head + "set -euo pipefail\n"
            f"export MS_ROLE={role}\n"
            f"export MS_SERVER_NUM={int(ps['servers'])}\n"
            f"export MS_WORKER_NUM={int(plan.cluster.devices)}\n"
            ": \"${MS_SCHED_HOST:?set MS_SCHED_HOST to the scheduler address}\"\n"
            f"export MS_SCHED_HOST\nexport MS_SCHED_PORT=\"${{MS_SCHED_PORT:-{DEFAULT_SCHED_PORT}}}\"\n"
            "TRAIN_SCRIPT=\"${TRAIN_SCRIPT:-train.py}\"   # your script: imports ps_context and calls place_on_servers\n"
            + body)


def role_scripts(plan: Plan) -> dict[str, str]:
    per_node = plan.hardware.node.devices_per_node
    ps = plan.parameter_server
    where = ("on each of the first {n} worker nodes" if ps["server_placement"] == "colocated"
             else "on each of {n} dedicated server hosts").format(n=int(ps["servers"]))
    return {
        "run_scheduler.sh": _script(plan, "MS_SCHED", "# run once, on the host named by MS_SCHED_HOST\n"
                                    "python \"$TRAIN_SCRIPT\" \"$@\"\n"),
        "run_server.sh": _script(plan, "MS_PSERVER", f"# run {where}\npython \"$TRAIN_SCRIPT\" \"$@\"\n"),
        "run_worker.sh": _script(plan, "MS_WORKER",
                                 f"# run on each of the {int(plan.cluster.nodes)} worker nodes: one worker per device\n"
                                 f"LOCAL_WORKERS=\"${{LOCAL_WORKERS:-{int(min(per_node, plan.cluster.devices))}}}\"\n"
                                 "pids=()\n"
                                 "for ((i = 0; i < LOCAL_WORKERS; i++)); do\n"
                                 "  DEVICE_ID=$i python \"$TRAIN_SCRIPT\" \"$@\" > \"worker_$i.log\" 2>&1 &\n"
                                 "  pids+=($!)\n"
                                 "done\n"
                                 "# exit with the first failing worker's code (a bare wait would exit 0)\n"
                                 "status=0\n"
                                 "for i in \"${!pids[@]}\"; do\n"
                                 "  code=0\n"
                                 "  wait \"${pids[$i]}\" || code=$?\n"
                                 "  if [ \"$code\" -ne 0 ]; then\n"
                                 "    echo \"worker $i failed with exit code $code (see worker_$i.log)\" >&2\n"
                                 "    if [ \"$status\" -eq 0 ]; then status=$code; fi\n"
                                 "  fi\n"
                                 "done\n"
                                 "exit \"$status\"\n"),
    }


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    notes = ["the scripts read TRAIN_SCRIPT (your training script, default train.py) and MS_SCHED_HOST / "
             "MS_SCHED_PORT from the environment"]
    unsupported: list[str] = asynchronous_unsupported(plan)
    version = _version(target_version) if target_version is not None else None
    if plan.parameter_server is not None:
        if version is not None and version > LAST_PS_VERSION:
            unsupported.append(f"--target-version {display(target_version[:20])}: MindSpore 2.8 removed "
                               "Parameter.set_param_ps, so parameter-server training needs MindSpore 2.7 or older; "
                               "ps_context.py is written for 2.7 and stops on a newer MindSpore")
        else:
            notes.append("written for MindSpore 2.7 or older (set_ps_context, set_param_ps, MS_ROLE: the same "
                         "from 1.x to 2.7; 2.8 removed set_param_ps)")
    files = {"ps_context.py": context_script(plan)}
    if plan.parameter_server is not None:
        files.update(role_scripts(plan))
        if plan.parameter_server["server_placement"] == "colocated":
            notes.append("co-located servers: start run_server.sh beside run_worker.sh on the first "
                         f"{int(plan.parameter_server['servers'])} worker nodes")
        if len(set(len(v) for v in plan.parameter_server["sharding"].values())) > 1:
            unsupported.append("parallel.parameter_server.sharding: MindSpore places tensors on servers itself "
                               "(large embeddings split by rows over all servers); the plan's placement is recorded "
                               "in ps_context.py as SERVER_SHARDING for reference")
    return ExportResult(target="mindspore", files=files, unsupported=tuple(unsupported), notes=tuple(notes))
