"""One estimate for a recommendation model in a given mode (advisor.cost.recsys, advisor.cost.recsys_host,
advisor.cost.parameter_server).

Validates the configuration (an error names the flag or plan field) and dispatches on the mode.
"""

from __future__ import annotations

from advisor.cost.parameter_server import estimate_parameter_server
from advisor.cost.recsys import MODES, PLACEMENTS, RecEstimate, RecsysConfig, estimate_replicated, estimate_sharded
from advisor.cost.recsys_host import estimate_host
from advisor.errors import AdvisorError
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.recommendation import RecModelSpec


def check_config(model: RecModelSpec, cluster: Cluster, config: RecsysConfig) -> None:
    if config.mode not in MODES:
        raise AdvisorError(f"parameter server: mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    if config.mode in ("replicated", "sharded", "host"):
        if config.servers or config.server_tensors:
            raise AdvisorError(f"parameter server: mode {config.mode} has no servers (got {config.servers})")
        tables = [t.name for t in model.tables]
        wrong = [t for t in config.host_tables if t not in tables]
        if (config.host_tables and config.mode != "host") or wrong or len(set(config.host_tables)) != len(config.host_tables):
            raise AdvisorError(f"host tables must be distinct embedding tables of {model.name}, with mode host "
                               f"(got {str(wrong[:1] or list(config.host_tables))[:60]} with mode {config.mode})")
        return
    if config.server_placement not in PLACEMENTS:
        raise AdvisorError(f"parameter server: server_placement must be one of {', '.join(PLACEMENTS)}, "
                           f"got {config.server_placement!r}")
    if config.servers < 1:
        raise AdvisorError(f"--ps-servers must be a positive integer for mode {config.mode}, got {config.servers}")
    if config.server_placement == "colocated" and config.servers > cluster.nodes:
        raise AdvisorError(f"--ps-servers {config.servers}: co-located servers run one per worker node, and the "
                           f"cluster has {cluster.nodes} nodes")
    known = model.tensor_params()
    unknown = [t for t in config.server_tensors if t not in known]
    if unknown or not config.server_tensors:
        raise AdvisorError(f"parameter server: tensors must name parameters of {model.name} "
                           f"(got {str(unknown[:1] or list(config.server_tensors))[:60]})")
    if config.mode == "ps" and set(config.server_tensors) != set(known):
        raise AdvisorError("parameter server: mode ps puts every tensor on the servers; use mode hybrid for a subset")


def estimate_recsys(model: RecModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob,
                    config: RecsysConfig) -> RecEstimate:
    check_config(model, cluster, config)
    if config.mode == "replicated":
        return estimate_replicated(model, hardware, cluster, job, config)
    if config.mode == "sharded":
        return estimate_sharded(model, hardware, cluster, job, config)
    if config.mode == "host":
        return estimate_host(model, hardware, cluster, job, config)
    return estimate_parameter_server(model, hardware, cluster, job, config)
