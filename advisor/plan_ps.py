"""The plan fields of recommendation models: ``parallel.parameter_server`` and ``parallel.embedding_placement``.

``parameter_server`` (DESIGN.md, second wave) is null for collective-only plans, else
``{"mode": "ps"|"hybrid", "synchronous": bool, "servers": N, "server_placement": "dedicated"|"colocated",
"tensors": [...], "sharding": {tensor: [server, ...]}, "replicas": 0|1}``: ``tensors`` are the parameters the servers
hold (every one for ps; table names and tower layers ``bottom_mlp_i`` / ``top_mlp_i`` as
advisor.specs.recommendation.RecModelSpec.tensor_params names them) and ``sharding`` lists the
servers of each (a tensor on several servers is split evenly by rows, in that order). ``replicas`` 1 keeps a
copy of each server's shard on the next server (Li et al. 2014, OSDI, section 4.3: chain replication of key
ranges; the primary forwards each step's aggregated update), so a server that fails is taken over by its
backup with no update lost; 0 (the default, and what an older plan without the key means): none.
``embedding_placement`` says where the tables live: "replicated" (data parallel), "sharded" (over
the devices, all-to-all), "host" (each worker's host memory, looked up by its CPU: MindSpore's
Host&Device heterogeneous training) or "servers" (ps/hybrid). Validation names the field; nothing here knows
the cost model.
"""

from __future__ import annotations

from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.recommendation import RecModelSpec

PS_MODES = ("ps", "hybrid")
PLACEMENTS = ("dedicated", "colocated")
EMBEDDING_PLACEMENTS = ("replicated", "sharded", "host", "servers")
MAX_SERVERS = 4096
_KEYS = ("mode", "synchronous", "servers", "server_placement", "tensors", "sharding")
_OPTIONAL_KEYS = ("replicas",)           # absent in plans written before it: 0
REPLICAS = (0, 1)


def parameter_server_from_dict(value: Any, origin: str, model, cluster: Cluster) -> dict[str, Any] | None:
    o = f"{origin}: parallel.parameter_server"
    if value is None:
        return None
    if not isinstance(model, RecModelSpec):
        raise AdvisorError(f"{o}: a parameter server needs a model with family: recommendation "
                           f"(model {str(getattr(model, 'name', ''))[:40]!r} is a transformer)")
    f.check_keys(value, o, _KEYS, _OPTIONAL_KEYS)
    mode = f.choice(value, "mode", o, PS_MODES)
    servers = f.positive_int(value, "servers", o)
    if servers > MAX_SERVERS:
        raise AdvisorError(f"{o}: key 'servers' = {servers} exceeds {MAX_SERVERS}")
    placement = f.choice(value, "server_placement", o, PLACEMENTS)
    if placement == "colocated" and servers > cluster.nodes:
        raise AdvisorError(f"{o}: key 'servers' = {servers}: co-located servers run one per node and the cluster has "
                           f"{cluster.nodes} nodes")
    known = model.tensor_params()
    tensors = value["tensors"]
    if not isinstance(tensors, list) or not tensors or not all(isinstance(t, str) for t in tensors):
        raise AdvisorError(f"{o}: key 'tensors' must be a non-empty list of parameter names, got {str(tensors)[:60]!r}")
    for t in tensors:
        if t not in known:
            raise AdvisorError(f"{o}: key 'tensors' names {t[:40]!r}, which is not a parameter of {model.name}")
    if len(set(tensors)) != len(tensors):
        raise AdvisorError(f"{o}: key 'tensors' lists a tensor twice")
    if mode == "ps" and set(tensors) != set(known):
        missing = sorted(set(known) - set(tensors))[0]
        raise AdvisorError(f"{o}: mode 'ps' holds every parameter on the servers, but 'tensors' lacks {missing!r} "
                           f"(use mode 'hybrid' for a subset)")
    sharding = value["sharding"]
    if not isinstance(sharding, dict) or set(sharding) != set(tensors):
        raise AdvisorError(f"{o}: key 'sharding' must map every tensor in 'tensors' (and nothing else) to a list of "
                           f"servers, got keys {str(sorted(sharding) if isinstance(sharding, dict) else sharding)[:60]}")
    for name, where in sharding.items():
        ok = (isinstance(where, list) and where and len(set(where)) == len(where)
              and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < servers for s in where))
        if not ok:
            raise AdvisorError(f"{o}: sharding[{name[:40]!r}] must be a non-empty list of distinct server indices "
                               f"0..{servers - 1}, got {str(where)[:60]}")
    replicas = value.get("replicas", 0)
    if replicas not in REPLICAS or isinstance(replicas, bool):
        raise AdvisorError(f"{o}: key 'replicas' must be 0 or 1 (a backup of each server's shard on the next server), "
                           f"got {str(replicas)[:20]!r}")
    if replicas and servers < 2:
        raise AdvisorError(f"{o}: key 'replicas' = 1 needs at least 2 servers (each server's backup is the next one), "
                           f"got {servers}")
    return {"mode": mode, "synchronous": f.boolean(value, "synchronous", o), "servers": servers,
            "server_placement": placement, "tensors": list(tensors),
            "sharding": {k: list(v) for k, v in sharding.items()}, "replicas": replicas}


def embedding_placement_from_dict(data: dict[str, Any], origin: str, model, parameter_server) -> str | None:
    value = data.get("embedding_placement")
    o = f"{origin}: parallel"
    if value is None:
        return None
    if not isinstance(model, RecModelSpec):
        raise AdvisorError(f"{o}: key 'embedding_placement' needs a model with family: recommendation")
    placement = f.choice(data, "embedding_placement", o, EMBEDDING_PLACEMENTS)
    if (placement == "servers") != (parameter_server is not None):
        raise AdvisorError(f"{o}: key 'embedding_placement' = {placement!r} "
                           f"{'needs' if placement == 'servers' else 'conflicts with'} a parameter_server")
    return placement


def host_tables_from_dict(data: dict[str, Any], origin: str, model, placement: str | None) -> tuple[str, ...] | None:
    """``parallel.host_tables``: with placement "host", the tables kept in host memory (absent: all)."""
    value = data.get("host_tables")
    o = f"{origin}: parallel"
    if value is None:
        return None
    if placement != "host":
        raise AdvisorError(f"{o}: key 'host_tables' needs embedding_placement 'host' (got {placement!r})")
    names = [t.name for t in model.tables]
    if (not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value)
            or len(set(value)) != len(value)):
        raise AdvisorError(f"{o}: key 'host_tables' must be a non-empty list of distinct table names, "
                           f"got {str(value)[:60]!r}")
    for t in value:
        if t not in names:
            raise AdvisorError(f"{o}: key 'host_tables' names {t[:40]!r}, which is not a table of {model.name}")
    return tuple(value)


def rec_violations(model: RecModelSpec, cluster: Cluster, job: TrainingJob, strategy,
                   framework_rules: bool = True) -> list[str]:
    """A recommendation plan trains its towers data parallel over every device (no tp/pp/cp/ep); it has no
    framework rules (``framework_rules`` is taken for the family hook's signature)."""
    s = strategy
    if s.full_batch:
        return ["full_batch: a recommendation model's workers each read their share of the batch"]
    if s.host_embedding:
        return ["host_embedding: a recommendation model puts tables on the host with parallel.embedding_placement "
                "'host' and host_tables"]
    if (s.tp, s.pp, s.cp, s.ep) != (1, 1, 1, 1):
        return [f"a recommendation model trains data parallel only: tp, pp, cp and ep must be 1 "
                f"(got tp={s.tp} pp={s.pp} cp={s.cp} ep={s.ep})"]
    if s.dp != cluster.devices:
        return [f"dp = {s.dp} must equal the {cluster.devices} devices"]
    if s.dp * s.micro_batch_size * s.num_micro_batches != job.global_batch_size:
        return [f"dp x micro_batch_size x num_micro_batches = {s.dp * s.micro_batch_size * s.num_micro_batches} "
                f"must equal the global batch {job.global_batch_size}"]
    return []


def parallel_from_dict(parallel: dict[str, Any], origin: str, model, cluster: Cluster, strategy, training: TrainingJob,
                       mixed=None) -> dict[str, Any]:
    """The Plan fields of the recommendation family (advisor.families): its servers and table placement."""
    ps = parameter_server_from_dict(parallel.get("parameter_server"), origin, model, cluster)
    placement = embedding_placement_from_dict(parallel, origin, model, ps)
    return {"parameter_server": ps, "embedding_placement": placement,
            "host_tables": host_tables_from_dict(parallel, origin, model, placement)}


def parallel_to_dict(plan) -> dict[str, Any]:
    """The keys the recommendation family adds to a plan's parallel block."""
    out: dict[str, Any] = {}
    if plan.parameter_server is not None or isinstance(plan.model, RecModelSpec):
        out["parameter_server"] = plan.parameter_server
    if plan.embedding_placement is not None:
        out["embedding_placement"] = plan.embedding_placement
    if plan.host_tables is not None:
        out["host_tables"] = list(plan.host_tables)
    return out
