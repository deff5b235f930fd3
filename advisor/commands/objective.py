"""``recommend --objective time-to-target``: the global batch chosen jointly with the parallelism.

For one global batch, the steps to the target are fixed (advisor.cost.convergence), so the fastest
plan at that batch (``recommend``'s ranking by throughput) is also the one that reaches the target
first. Across batches the trade-off is McCandlish et al.'s: a larger batch runs more tokens per
second but, past the critical batch, needs more tokens. This orchestrator runs ``recommend`` at the
given global batch and at power-of-two multiples and fractions of it (BATCH_FACTORS) and keeps the
batch whose best plan reaches the target in the least wall-clock time; when that is the smallest
or largest batch tried, it goes on halving or doubling while the time improves. Every batch tried is
reported (``BatchTrial``), including those where nothing fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.commands.recommend import RecommendResult, recommend
from advisor.cost.convergence import Convergence, Target, convergence
from advisor.errors import AdvisorError, InfeasibleError
from advisor.families import family_of_model
from advisor.search import Pins
from advisor.specs import limits
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

OBJECTIVES = ("throughput", "time-to-target", "cost", "carbon")
BATCH_FACTORS = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8)
MAX_EXTENSIONS = 8          # further halvings or doublings past the range while the time improves


@dataclass(frozen=True)
class BatchTrial:
    global_batch_size: int
    convergence: Convergence
    tokens_per_s: float | None          # the best plan's, None when nothing fits or no strategy exists
    time_to_target_s: float | None
    why_not: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"global_batch_size": self.global_batch_size, "tokens_per_s": self.tokens_per_s,
                "time_to_target_s": self.time_to_target_s, "why_not": self.why_not, **self.convergence.to_dict()}


def candidate_batches(job: TrainingJob, cluster: Cluster) -> list[int]:
    """The given global batch and its power-of-two multiples and fractions, whole and in bounds."""
    out = []
    for factor in BATCH_FACTORS:
        b = job.global_batch_size * factor
        if b == int(b) and 1 <= b <= limits.MAX_GLOBAL_BATCH and int(b) not in out:
            out.append(int(b))
    return out


def time_to_target(model: ModelSpec, hardware: HardwareProfile, cluster: Cluster, job: TrainingJob, target: Target,
                   pins: Pins = Pins(), top_k: int = 5, searcher: str = "enumerate",
                   ) -> tuple[RecommendResult, tuple[BatchTrial, ...]]:
    """The plans at the global batch that reaches the target first, each plan's prediction with its
    ``time_to_target``; and every batch tried. InfeasibleError when no batch has a plan that fits."""
    from advisor.commands.recommend import check_pins, check_top_k, find_searcher

    # what does not depend on the batch is refused once, before any search
    fam = family_of_model(model)
    if "time-to-target" not in fam.objectives:
        raise AdvisorError(f"--objective time-to-target ranks transformer plans; {model.name} is a {fam.name} model")
    find_searcher(searcher)
    check_top_k(top_k)
    check_pins(cluster, pins)
    trials, best = [], None

    def trial(b: int) -> None:
        nonlocal best
        conv = convergence(model, target, float(b) * job.seq_length)
        try:
            result = recommend(model, hardware, cluster, replace(job, global_batch_size=b), pins, top_k, searcher,
                               suggest=False)
        except (InfeasibleError, AdvisorError) as exc:
            trials.append(BatchTrial(b, conv, None, None, str(exc)))
            return
        seconds = conv.steps_to_target * result.estimates[0].step_time_s
        trials.append(BatchTrial(b, conv, result.estimates[0].tokens_per_s, seconds))
        if best is None or seconds < best[0]:
            best = (seconds, b, result, conv)

    for b in candidate_batches(job, cluster):
        trial(b)
    # the best at an end of the range: go on past it (halving or doubling) while it keeps improving
    for _ in range(MAX_EXTENSIONS):
        tried = sorted(t.global_batch_size for t in trials)
        if best is None or best[1] not in (tried[0], tried[-1]):
            break
        b = best[1] // 2 if best[1] == tried[0] else best[1] * 2
        if best[1] == tried[0] and (best[1] % 2 or b < 1) or b > limits.MAX_GLOBAL_BATCH:
            break
        before = best[1]
        trial(b)
        if best[1] == before:
            break
    trials.sort(key=lambda t: t.global_batch_size)
    if best is None:
        raise InfeasibleError(f"no global batch from {trials[0].global_batch_size} to {trials[-1].global_batch_size} "
                              f"has a plan for {model.name} on {cluster.devices} devices: "
                              f"{trials[len(trials) // 2].why_not}")
    _, _, result, conv = best
    plans = tuple(replace(p, target=target.to_dict(),
                          prediction={**p.prediction, "time_to_target": {
                              **conv.to_dict(), "seconds": conv.steps_to_target * e.step_time_s}})
                  for p, e in zip(result.plans, result.estimates))
    return replace(result, plans=plans), tuple(trials)


def target_from_flags(tokens: str | None, loss: float | None, critical_batch_tokens: str | None) -> Target:
    """The target of --target-tokens / --target-loss and --critical-batch-tokens (token counts as --tokens
    reads them: 300B, 2T, 1.5e12)."""
    from advisor.specs.job import parse_token_count

    def count(flag: str, text: str | None) -> float | None:
        return None if text is None else parse_token_count(text, flag)
    if tokens is None and loss is None:
        raise AdvisorError("--objective time-to-target needs --target-tokens (tokens to the target at a small "
                           "batch, with --critical-batch-tokens) or --target-loss")
    return Target(tokens=count("--target-tokens", tokens), loss=loss,
                  critical_batch_tokens=count("--critical-batch-tokens", critical_batch_tokens))


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise AdvisorError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective[:40]!r}")
    return objective


def target_for(objective: str, tokens: str | None, loss: float | None, critical_batch_tokens: str | None) -> Target | None:
    """The target of the time-to-target objective; target flags with another objective are refused."""
    if check_objective(objective) == "time-to-target":
        return target_from_flags(tokens, loss, critical_batch_tokens)
    given = [flag for flag, v in (("--target-tokens", tokens), ("--target-loss", loss),
                                  ("--critical-batch-tokens", critical_batch_tokens)) if v is not None]
    if given:
        raise AdvisorError(f"{', '.join(given)} go with --objective time-to-target (the objective is {objective})")
    return None
