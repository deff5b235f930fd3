"""The options of ``estimate`` and ``recommend`` that are not training settings: what to plan for (the
model, the hardware, the cluster size) and what the command does (search, print, save). Declared as
settings like the job's (advisor.specs.setting), so that the command line is generated from them
(advisor.commands.cli_settings)."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.setting import setting

BOTH = ("estimate", "recommend")


@dataclass(frozen=True)
class InputOptions:
    """What to plan for: the model, the hardware and the cluster's size."""

    model: str | None = setting(
        None, kind="text", flags=("--model",), commands=BOTH, required_on=("recommend",),
        help="bundled model name or path", doc="A bundled model name (advisor list models) or a model file.")
    hardware: str | None = setting(
        None, kind="text", flags=("--hardware",), commands=BOTH, required_on=("recommend",),
        help="bundled hardware profile or path; a mixed cluster as PROFILE:NODES,PROFILE:NODES (then no "
             "--nodes/--devices)",
        doc="A bundled hardware profile (advisor list hardware), a profile file, or a mixed cluster's parts.")
    nodes: int | None = setting(
        None, kind="positive_int", flags=("--nodes",), commands=BOTH,
        help="cluster size in nodes of the profile (or give --devices)", doc="The cluster's size in nodes.")
    devices: int | None = setting(
        None, kind="positive_int", flags=("--devices",), commands=BOTH,
        help="cluster size in devices (or give --nodes); need not fill the last node (a warning)",
        doc="The cluster's size in devices.")


@dataclass(frozen=True)
class SearchOptions:
    """How ``recommend`` searches and what it shows and saves; ``estimate``'s plan and layout inputs."""

    plan: str | None = setting(
        None, kind="text", flags=("--plan",), commands=("estimate",),
        help="score the strategy of a plan JSON instead", doc="A plan JSON whose strategy is scored.")
    from_file: str | None = setting(
        None, kind="text", flags=("--from",), commands=BOTH,
        help="a launch configuration you have: a Megatron-LM argument list or launch script, a Megatron-Bridge or "
             "NeMo 2 YAML, a DeepSpeed config or launcher, a torchtitan job TOML or a MindFormers YAML (with --model "
             "and --hardware; flags given override it): estimate prices it, recommend pins what it pins and searches "
             "the rest",
        doc="A launch configuration whose settings are priced (advisor.importers).")
    searcher: str = setting(
        "enumerate", kind="text", flags=("--searcher",), commands=("recommend",), help="enumerate | drec | ilp",
        doc="The searcher (advisor.commands.recommend.SEARCHERS).")
    top: int = setting(
        5, kind="positive_int", flags=("--top",), commands=("recommend",), help="how many plans to show",
        doc="How many plans to rank and show.")
    operator_strategies: str | None = setting(
        None, kind="text", flags=("--operator-strategies",), commands=BOTH,
        help="YAML/JSON: operator name -> cuts per input (MindSpore shard() form), kept fixed; the other operators "
             "are searched around them (drec | ilp)",
        doc="User-fixed operator strategies, MindSpore shard() form (advisor.specs.operator_strategies).")
    out: str | None = setting(
        None, kind="text", flags=("--out",), commands=BOTH,
        help="write the plan JSON here (recommend: the best; estimate: the priced strategy, when it fits)",
        doc="Where the plan JSON is written: recommend's best plan, or estimate's strategy with its prediction.")
    all_candidates: str | None = setting(
        None, kind="text", flags=("--all-candidates",), commands=("recommend",),
        help="also write every candidate of the space that fits, priced, as CSV here (one row each: its settings, "
             "throughput and its pessimistic end, step time, MFU, memory and time by part); - for stdout",
        doc="Where every fitting candidate of the exhaustive enumerator is written as CSV (advisor.search.all_candidates).")
    plot: str | None = setting(
        None, kind="text", flags=("--plot",), commands=("recommend",),
        help="write the top plans' time and memory breakdown (PNG) here", doc="Where the breakdown plot is written.")
    ps_mode: str | None = setting(
        None, kind="text", flags=("--ps-mode",), commands=BOTH,
        help="recommendation models: pin none (collectives only: replicated or sharded tables) | ps (every tensor on "
             "parameter servers) | hybrid (tables on servers, towers all-reduced)",
        doc="Recommendation models: the parameter-server mode (advisor.search.parameter_server).")
    ps_servers: int | None = setting(
        None, kind="positive_int", flags=("--ps-servers",), commands=BOTH, help="pin the parameter-server count",
        doc="Recommendation models: the parameter-server count.")
    ps_async: bool = setting(
        False, kind="boolean", flags=("--ps-async",), commands=BOTH,
        help="asynchronous parameter servers (staleness reported)", doc="Asynchronous parameter servers.")
    ps_replicas: int | None = setting(
        None, kind="non_negative_int", flags=("--ps-replicas",), commands=BOTH,
        help="1: a backup of each server's shard on the next server, so a failed server is taken over (priced: "
             "the forwarded updates and the copy); 0: none",
        doc="Recommendation models: server replication (parallel.parameter_server.replicas, advisor.plan_ps).")
    objective: str = setting(
        "throughput", kind="text", flags=("--objective",), commands=("recommend",),
        help="throughput | time-to-target (the global batch chosen with the parallelism) | cost (the cluster size, "
             "up to the given one, that trains a token for the least money) | carbon (tokens per kWh)",
        doc="What the ranking maximizes (advisor.commands.objective, objective_cost).")
    target_tokens: str | None = setting(
        None, kind="text", flags=("--target-tokens",), commands=("recommend",),
        help="time-to-target: tokens to the target at a small batch, e.g. 300B (with --critical-batch-tokens)",
        doc="Time-to-target: the tokens to the target at a small batch.")
    target_loss: float | None = setting(
        None, kind="positive_float", flags=("--target-loss",), commands=("recommend",),
        help="time-to-target: a loss in Kaplan et al. 2020's units (nats per token)",
        doc="Time-to-target: the target loss.")
    critical_batch: str | None = setting(
        None, kind="text", flags=("--critical-batch-tokens",), commands=("recommend",),
        help="measured critical batch (gradient noise scale) in tokens, e.g. 4M",
        doc="Time-to-target: a measured critical batch in tokens.")
    json: bool = setting(
        False, kind="boolean", flags=("--json",), commands=BOTH, help="print only JSON",
        doc="Print only JSON on stdout.")


# every class whose settings reach the command line of estimate and recommend, in the order of --help
ALL_CLASSES = (InputOptions, TrainingJob, Strategy, SearchOptions)
