"""What starts a MindSpore plan: msrun, dynamic cluster, mpirun and (on Ascend) the HCCL rank table.

MindSpore documents four ways to start a distributed job (tutorials "Distributed Parallel Startup
Methods", mirrored as mindspore-ai/docs tutorials/source_en/parallel/*.md):

* msrun (msrun_launcher.md, https://www.mindspore.cn/tutorials/en/master/parallel/msrun_launcher.html):
  one command per node, ``--worker_num`` (all workers), ``--local_worker_num`` (this node's),
  ``--master_addr`` / ``--master_port`` (the Scheduler; msrun starts it on the node whose address is
  master_addr; port 1024-65535, default 8118), ``--node_rank`` (rank ids by node; to be left out
  when nodes run different numbers of workers), ``--log_dir``, ``--join``, ``--cluster_time_out``,
  then the training script and its arguments. Flags are written ``--flag=value`` as in the tutorial.
* dynamic cluster (dynamic_cluster.md): one Scheduler process (``MS_ROLE=MS_SCHED``) and one process
  per device (``MS_ROLE=MS_WORKER``), all with the same ``MS_SCHED_HOST``, ``MS_SCHED_PORT`` and
  ``MS_WORKER_NUM``; ``MS_NODE_ID`` set to an integer fixes a worker's rank id.
* mpirun (mpirun.md): OpenMPI ``mpirun -n N --hostfile FILE`` with a hostfile of
  ``<host> slots=<n>`` lines; on Ascend ``RANK_TABLE_FILE`` must not be set.
* rank table (rank_table.md, Ascend only): ``RANK_TABLE_FILE``, ``RANK_SIZE`` and per process
  ``DEVICE_ID`` / ``RANK_ID``; the table itself is advisor.export.rank_table.

Every script takes the node's rank as its first argument (node 0 runs the Scheduler) and passes its
other arguments to the training script. Addresses come from ``LaunchOptions.hosts`` or are
placeholders (advisor.export.rank_table); scripts also read ``MASTER_ADDR``, ``MASTER_PORT``,
``MS_SCHED_HOST``, ``MS_SCHED_PORT``, ``HOSTFILE``, ``RANK_TABLE_FILE`` and ``TRAIN_SCRIPT`` from
the environment. Every value is quoted with shlex.quote; the rank table is built with json.dumps.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.export._common import comment_block, header_lines  # comment_block escapes non-printables
from advisor.export.rank_table import (
    PLACEHOLDER_RANGES_TEXT, hccs_groups, hccs_problems, is_ascend, placeholder_device_addresses,
    placeholder_server_addresses, rank_table,
)
from advisor.plan import Plan

DEFAULT_MASTER_PORT = 8118         # msrun --master_port default (msrun_launcher.md)
# MindFormers' msrun wrapper waits 7200 s for all workers to register (mindformers scripts/msrun_launcher.sh,
# CLUSTER_TIME_OUT); msrun's own default of 600 s is short for large jobs whose nodes start at different times.
CLUSTER_TIME_OUT_S = 7200
DEFAULT_TRAIN_SCRIPT = "run_mindformer.py"   # MindFormers' training entry point (mindformers/run_mindformer.py)
MSRUN_LOG_DIR = "msrun_log"                  # the tutorial's --log_dir
LOCAL_MASTER = "127.0.0.1"                   # msrun's default master_addr, for a one-node job

FILES = {
    "msrun": "launch_msrun.sh",
    "scheduler": "launch_dynamic_scheduler.sh",
    "worker": "launch_dynamic_worker.sh",
    "mpirun": "launch_mpirun.sh",
    "hostfile": "hostfile",
    "rank_table": "rank_table.json",
    "rank_table_launch": "launch_rank_table.sh",
}

_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")  # RFC 1123 host name


@dataclass(frozen=True)
class LaunchOptions:
    hosts: tuple[str, ...] = ()            # one address or host name per node, node 0 first
    master_port: int = DEFAULT_MASTER_PORT
    train_script: str = DEFAULT_TRAIN_SCRIPT


@dataclass(frozen=True)
class Node:
    rank: int           # msrun --node_rank
    address: str        # what the launchers use to reach it
    workers: int        # processes (devices) on it
    first_rank: int     # global rank of its first process


def devices_per_node(plan: Plan) -> list[int]:
    """Processes on each node: equal shares when the devices divide evenly, else full nodes and a
    last partial one (Cluster.of's convention: devices need not fill the last node)."""
    nodes, devices = plan.cluster.nodes, plan.cluster.devices
    per_node = plan.hardware.node.devices_per_node
    if devices % nodes == 0:
        return [devices // nodes] * nodes
    counts = [min(per_node, devices - i * per_node) for i in range(nodes)]
    if min(counts) <= 0:
        base, extra = divmod(devices, nodes)
        counts = [base + (1 if i < extra else 0) for i in range(nodes)]
    if min(counts) <= 0:
        raise AdvisorError(f"cluster.devices = {devices} is fewer than cluster.nodes = {nodes}: "
                           "a node would start no process")
    return counts


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _check_host(host: object, i: int) -> None:
    if not isinstance(host, str) or not host:
        raise AdvisorError(f"hosts: entry {i} must be a non-empty address or host name")
    if _is_ip(host) and ipaddress.ip_address(host).version == 6:
        raise AdvisorError(f"hosts: entry {i} = {host[:40]!r} is an IPv6 address; give IPv4 addresses or host names "
                           "(msrun releases before 2.9 take none, msrun tutorial r2.7 vs r2.9)")
    if not _is_ip(host) and not _HOSTNAME.match(host):
        raise AdvisorError(f"hosts: entry {i} = {host[:40]!r} is neither an IP address nor a host name")


def check_options(options: LaunchOptions, nodes: int) -> None:
    if len(options.hosts) not in (0, nodes):
        raise AdvisorError(f"hosts: {len(options.hosts)} given for a plan on {nodes} nodes (give one per node)")
    for i, host in enumerate(options.hosts):
        _check_host(host, i)
    if len(set(options.hosts)) != len(options.hosts):
        raise AdvisorError("hosts: the same host is given twice")
    port = options.master_port
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise AdvisorError(f"master_port = {str(port)[:20]!r}: must be a port in 1024..65535 (msrun --master_port)")
    if not isinstance(options.train_script, str) or not options.train_script.strip():
        raise AdvisorError("train_script: give the training script to start")


def node_layout(plan: Plan, options: LaunchOptions) -> tuple[Node, ...]:
    counts = devices_per_node(plan)
    check_options(options, len(counts))
    if options.hosts:
        addresses = list(options.hosts)
    elif len(counts) == 1:
        addresses = ["localhost"]
    else:
        addresses = placeholder_server_addresses(len(counts))
    nodes, first = [], 0
    for rank, (address, workers) in enumerate(zip(addresses, counts)):
        nodes.append(Node(rank=rank, address=address, workers=workers, first_rank=first))
        first += workers
    return tuple(nodes)


def _default(var: str, value: str) -> str:
    """Shell: use the environment's value of `var`, else `value` (quoted)."""
    return f'if [ -z "${{{var}:-}}" ]; then {var}={shlex.quote(value)}; fi\n'


def _default_expr(var: str, expr: str) -> str:
    """Shell: use the environment's value of `var`, else the shell expression `expr` (advisor's own text)."""
    return f'if [ -z "${{{var}:-}}" ]; then {var}={expr}; fi\n'


def _head(plan: Plan, what: str, usage: str, placeholders: bool) -> str:
    lines = header_lines(plan, f"MindSpore launcher: {what}") + [f"usage: {usage}"]
    if placeholders:
        lines.append(f"Addresses are placeholders ({PLACEHOLDER_RANGES_TEXT}): replace them with your nodes'.")
    return "#!/usr/bin/env bash\n" + comment_block(lines) + "set -euo pipefail\n"


def _node_rank_arg(script: str, nodes: tuple[Node, ...]) -> str:
    last = len(nodes) - 1
    return (f'NODE_RANK="${{1:?usage: bash {script} NODE_RANK (0..{last}) [training arguments]}}"\n'
            "shift\n"
            f'if ! [[ "$NODE_RANK" =~ ^(0|[1-9][0-9]*)$ ]] || (( NODE_RANK > {last} )); then\n'
            f'  echo "NODE_RANK must be 0..{last}" >&2; exit 2\n'
            "fi\n")


# wait for every process; exit with the last failure's status (a plain `wait` always returns 0)
_WAIT_ALL = 'status=0\nfor pid in "${pids[@]}"; do wait "$pid" || status=$?; done\nexit "$status"\n'


def _arrays(nodes: tuple[Node, ...]) -> str:
    return (f"LOCAL_WORKERS=({' '.join(str(n.workers) for n in nodes)})   # processes on node 0, 1, ...\n"
            f"FIRST_RANK=({' '.join(str(n.first_rank) for n in nodes)})      # global rank of each node's first\n")


def msrun_line(node: Node, nodes: tuple[Node, ...]) -> str:
    """The msrun command of one node; the address, port and script come from shell variables."""
    total = sum(n.workers for n in nodes)
    flags = [f"--worker_num={total}", f"--local_worker_num={node.workers}",
             '--master_addr="$MASTER_ADDR"', '--master_port="$MASTER_PORT"']
    if len({n.workers for n in nodes}) == 1:   # msrun_launcher.md: leave node_rank out when counts differ
        flags.append(f"--node_rank={node.rank}")
    flags += [f"--log_dir={MSRUN_LOG_DIR}", "--join=True", f"--cluster_time_out={CLUSTER_TIME_OUT_S}"]
    return "msrun " + " ".join(flags) + ' "$TRAIN_SCRIPT" "$@"'


def msrun_script(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, master: str, ph: bool) -> str:
    script = FILES["msrun"]
    cases = "".join(f"  {n.rank}) {msrun_line(n, nodes)} ;;\n" for n in nodes)
    return (_head(plan, "msrun, one command per node", f"bash {script} NODE_RANK [training arguments], on every "
                  "node (msrun starts the Scheduler on the node whose address is MASTER_ADDR)", ph)
            + _default("MASTER_ADDR", master) + _default("MASTER_PORT", str(options.master_port))
            + _default("TRAIN_SCRIPT", options.train_script) + _node_rank_arg(script, nodes)
            + 'case "$NODE_RANK" in\n' + cases + "esac\n")


def _role_env(total: int, master: str, options: LaunchOptions) -> str:
    return (_default("MS_SCHED_HOST", master) + _default("MS_SCHED_PORT", str(options.master_port))
            + _default("TRAIN_SCRIPT", options.train_script)
            + f"export MS_SCHED_HOST MS_SCHED_PORT MS_WORKER_NUM={total}\n"
            + f"mkdir -p {MSRUN_LOG_DIR}\n")


def scheduler_script(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, master: str, ph: bool) -> str:
    total = sum(n.workers for n in nodes)
    return (_head(plan, "dynamic cluster, Scheduler role", f"bash {FILES['scheduler']} [training arguments], "
                  "once, on node 0 (MS_SCHED_HOST), beside its workers", ph)
            + _role_env(total, master, options) + "export MS_ROLE=MS_SCHED\n"
            + f'python "$TRAIN_SCRIPT" "$@" > {MSRUN_LOG_DIR}/scheduler.log 2>&1\n')


def worker_script(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, master: str, ph: bool) -> str:
    total = sum(n.workers for n in nodes)
    script = FILES["worker"]
    return (_head(plan, "dynamic cluster, Worker role", f"bash {script} NODE_RANK [training arguments], on "
                  "every node", ph)
            + _role_env(total, master, options) + "export MS_ROLE=MS_WORKER\n"
            + _node_rank_arg(script, nodes) + _arrays(nodes)
            + "pids=()\nfor ((i = 0; i < LOCAL_WORKERS[NODE_RANK]; i++)); do\n"
            + "  rank=$((FIRST_RANK[NODE_RANK] + i))\n"
            + "  # MS_NODE_ID fixes the worker's rank id (dynamic_cluster.md), so ranks follow node order\n"
            + f'  MS_NODE_ID=$rank python "$TRAIN_SCRIPT" "$@" > {MSRUN_LOG_DIR}/worker_$rank.log 2>&1 &\n'
            + "  pids+=($!)\n"
            + "done\n" + _WAIT_ALL)


def hostfile(plan: Plan, nodes: tuple[Node, ...], ph: bool) -> str:
    lines = [f"advisor plan {plan.model.name} -> OpenMPI hostfile: one line per node, '<host> slots=<processes>'"]
    if ph:
        lines.append(f"Addresses are placeholders ({PLACEHOLDER_RANGES_TEXT}): replace them with your nodes'.")
    return comment_block(lines) + "".join(f"{n.address} slots={n.workers}\n" for n in nodes)


def mpirun_script(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, ph: bool) -> str:
    total = sum(n.workers for n in nodes)
    return (_head(plan, "OpenMPI mpirun", f"bash {FILES['mpirun']} [training arguments], on node 0 (with "
                  "password-less ssh to the others); OpenMPI fills each host's slots in hostfile order", ph)
            + 'HERE="$(cd "$(dirname "$0")" && pwd)"\n'
            + _default_expr("HOSTFILE", '"$HERE/hostfile"')
            + _default("TRAIN_SCRIPT", options.train_script)
            + "unset RANK_TABLE_FILE   # mpirun.md: must not be set when mpirun starts the job on Ascend\n"
            + f'mpirun -n {total} --hostfile "$HOSTFILE" --output-filename log_output --merge-stderr-to-stdout '
            + 'python "$TRAIN_SCRIPT" "$@"\n')


def rank_table_script(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, ph: bool) -> str:
    total = sum(n.workers for n in nodes)
    script = FILES["rank_table_launch"]
    return (_head(plan, "HCCL rank table (Ascend)", f"bash {script} NODE_RANK [training arguments], on every "
                  "node; node NODE_RANK is server_list[NODE_RANK] of rank_table.json", ph)
            + 'HERE="$(cd "$(dirname "$0")" && pwd)"\n'
            + _default_expr("RANK_TABLE_FILE", f'"$HERE/{FILES["rank_table"]}"')
            + _default("TRAIN_SCRIPT", options.train_script)
            + f"export RANK_TABLE_FILE RANK_SIZE={total}\n"
            + _node_rank_arg(script, nodes) + _arrays(nodes)
            + "mkdir -p rank_table_log\n"
            + "pids=()\nfor ((i = 0; i < LOCAL_WORKERS[NODE_RANK]; i++)); do\n"
            + "  rank=$((FIRST_RANK[NODE_RANK] + i))\n"
            + '  DEVICE_ID=$i RANK_ID=$rank python "$TRAIN_SCRIPT" "$@" > rank_table_log/train_$rank.log 2>&1 &\n'
            + "  pids+=($!)\n"
            + "done\n" + _WAIT_ALL)


def _server_ids(nodes: tuple[Node, ...], options: LaunchOptions, notes: list[str]) -> list[str]:
    placeholders = placeholder_server_addresses(len(nodes))
    ids = [n.address if options.hosts and _is_ip(n.address) else placeholders[n.rank] for n in nodes]
    if options.hosts and any(not _is_ip(n.address) for n in nodes):
        notes.append("rank_table.json: server_id must be an IP address; host names were replaced by placeholders")
    if ids != sorted(ids):
        raise AdvisorError("hosts: the rank table needs rank ids in the dictionary order of server_id "
                           "(MindSpore rank table tutorial); list the hosts in that order")
    return ids


def _rank_table_file(plan: Plan, nodes: tuple[Node, ...], options: LaunchOptions, notes: list[str],
                     unsupported: list[str]) -> str:
    counts = [n.workers for n in nodes]
    unsupported += hccs_problems(plan.hardware, counts)
    groups = hccs_groups(plan.hardware)
    if len(groups) > 1:
        text = " and ".join(f"{g[0]}-{g[-1]}" for g in groups)
        notes.append(f"rank_table.json: each {plan.hardware.name} server has HCCS groups of devices {text}; "
                     "traffic between groups crosses PCIe"
                     + (f" (tensor-parallel groups of {plan.strategy.tp} span both)"
                        if plan.strategy.tp > len(groups[0]) else ""))
    table = rank_table(_server_ids(nodes, options, notes), counts, placeholder_device_addresses(sum(counts)))
    return json.dumps(table, indent=2, allow_nan=False) + "\n"


def launch_files(plan: Plan, notes: list[str], unsupported: list[str],
                 options: LaunchOptions | None = None) -> dict[str, str]:
    """The launcher files for the plan (name -> text), in FILES order."""
    options = options or LaunchOptions()
    nodes = node_layout(plan, options)
    ph = not options.hosts and len(nodes) > 1
    master = nodes[0].address if len(nodes) > 1 or options.hosts else LOCAL_MASTER
    files = {
        FILES["msrun"]: msrun_script(plan, nodes, options, master, ph),
        FILES["scheduler"]: scheduler_script(plan, nodes, options, master, ph),
        FILES["worker"]: worker_script(plan, nodes, options, master, ph),
        FILES["mpirun"]: mpirun_script(plan, nodes, options, ph),
        FILES["hostfile"]: hostfile(plan, nodes, ph),
    }
    if len({n.workers for n in nodes}) > 1:
        notes.append("launch_msrun.sh: nodes run different numbers of workers, so --node_rank is left out and "
                     "msrun assigns the rank ids (msrun tutorial)")
    if is_ascend(plan.hardware):
        files[FILES["rank_table"]] = _rank_table_file(plan, nodes, options, notes, unsupported)
        files[FILES["rank_table_launch"]] = rank_table_script(plan, nodes, options, ph)
        what = "device_ip values are" if options.hosts else "server_id and device_ip values are"
        notes.append(f"rank_table.json: {what} placeholders ({PLACEHOLDER_RANGES_TEXT}): fill in each server's IP "
                     "and its device NIC addresses from /etc/hccn.conf (address_<device_id>, rank table tutorial)")
    else:
        notes.append(f"rank_table.json: the rank table startup is for Ascend only (MindSpore rank table tutorial); "
                     f"not written for {plan.hardware.device.name}")
    if ph:
        notes.append(f"launch scripts and hostfile: node addresses are placeholders ({PLACEHOLDER_RANGES_TEXT}); "
                     "replace them, or set MASTER_ADDR / MS_SCHED_HOST / HOSTFILE when launching")
    return files
