"""The framework's own recipe as a baseline for recommend's #1.

advisor/specs/recipes.yaml (written by benchmarks/write_recipes.py) lists, for the bundled models, the layouts
the frameworks published and measured: Megatron-Bridge's performance tables, torchtitan's benchmark tables,
MindFormers' and llm-foundry's, each with its source (table, release) and its measured tokens per second. For
the user's model (matched by shape), profile, device count and framework, recommend prices the recipe's layout
under the user's job (its micro-batch count follows the user's global batch) and prints it beside the #1:
"#1 vs recipe: +x%", inside or outside the #1's error band, and where outside the time parts that differ most.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any


from advisor.cost.estimate import Estimate, estimate
from advisor.errors import AdvisorError
from advisor.plan_codec import strategy_from_dict
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec, load_model
from advisor import bundled_yaml

RECIPES_FILE = Path(__file__).resolve().parents[1] / "specs" / "recipes.yaml"
TOP_DIFFERENCES = 2         # time parts named where the #1 and the recipe differ beyond the band


def shape_key(model: ModelSpec) -> tuple | None:
    """What makes two transformer descriptions the same model for a recipe (None: not a transformer)."""
    if not getattr(model, "num_layers", None) or not getattr(model, "hidden_size", None):
        return None
    moe = getattr(model, "moe", None)
    return (model.num_layers, model.hidden_size, model.num_attention_heads, getattr(model, "num_kv_heads", None),
            model.ffn_hidden_size, model.vocab_size,
            None if moe is None else (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size))


@dataclass(frozen=True)
class Recipe:
    """A published layout, priced under the user's job (estimate None: with why)."""

    entry: dict[str, Any]
    strategy: Strategy
    estimate: Estimate | None
    why_not: str | None = None

    def vs(self, first: Estimate) -> dict[str, Any]:
        """The #1 against the recipe: gain, whether the recipe lies inside the #1's band, and the parts that differ."""
        if self.estimate is None or not self.estimate.feasible:
            return {"gain": None, "inside_band": None, "differences": []}
        gain = first.tokens_per_s / self.estimate.tokens_per_s - 1.0
        low = first.band.tokens_per_s(first.tokens_per_s)[0] if first.band is not None else first.tokens_per_s
        inside = self.estimate.tokens_per_s >= low
        diffs = sorted(((part, self.estimate.time_s.get(part, 0.0) - first.time_s.get(part, 0.0))
                        for part in set(first.time_s) | set(self.estimate.time_s)), key=lambda x: -abs(x[1]))
        return {"gain": gain, "inside_band": inside,
                "differences": [] if inside else [{"part": p, "recipe_minus_first_s": d}
                                                  for p, d in diffs[:TOP_DIFFERENCES] if d != 0.0]}

    def to_dict(self, first: Estimate) -> dict[str, Any]:
        e = self.entry
        return {"source": e["source"], "run": e["run"], "framework": e["framework"],
               "published": {"global_batch_size": e["global_batch_size"], "seq_length": e["seq_length"],
                             "dtype": e["dtype"],
                             "measured_tokens_per_s_per_device": e["measured_tokens_per_s_per_device"]},
               "parallel": e["parallel"], "why_not": self.why_not,
               "prediction": None if self.estimate is None else {
                   "tokens_per_s": self.estimate.tokens_per_s, "step_time_s": self.estimate.step_time_s,
                   "memory_gib": self.estimate.memory_gib.total, "fits": self.estimate.feasible},
               "vs_first": self.vs(first)}


@lru_cache(maxsize=1)
def _entries() -> tuple[dict[str, Any], ...]:
    if not RECIPES_FILE.is_file():
        return ()
    return tuple(bundled_yaml.load(RECIPES_FILE)["recipes"])


@lru_cache(maxsize=64)
def _bundled_shape(name: str) -> tuple | None:
    return shape_key(load_model(name))


def recipe_for(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob) -> Recipe | None:
    """The recipe for this model, profile, device count and framework, priced under ``job`` (None: none published)."""
    key = shape_key(model)
    if key is None:
        return None
    found = [e for e in _entries() if e["hardware"] == hw.name and e["devices"] == cluster.devices
             and e["framework"] == job.framework and _bundled_shape(e["model"]) == key]
    if not found:
        return None
    entry = max(found, key=lambda e: e["measured_tokens_per_s_per_device"])
    s = strategy_from_dict(entry["parallel"], f"{RECIPES_FILE.name}: {entry['run']}")
    per_step = s.dp * s.micro_batch_size
    if job.global_batch_size % per_step:
        return Recipe(entry, s, None, f"its data-parallel degree x micro-batch ({per_step}) does not divide the global "
                                      f"batch {job.global_batch_size}")
    s = replace(s, num_micro_batches=job.global_batch_size // per_step)
    broken = violations(model, cluster, job, s)
    if broken:
        return Recipe(entry, s, None, f"not legal for this job: {broken[0]}")
    try:
        return Recipe(entry, s, estimate(model, hw, cluster, job, s))
    except AdvisorError as exc:
        return Recipe(entry, s, None, str(exc))
