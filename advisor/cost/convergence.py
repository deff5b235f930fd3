"""Converging efficiency: tokens and steps to reach a target, as the global batch changes.

* McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv 1812.06162), eq. 2.11
  and section 2.3: to reach a given loss, training at batch B takes S = S_min (1 + B_crit / B) steps
  and E = E_min (1 + B / B_crit) examples (here: tokens), with E_min = S_min x B_crit. Below the
  critical batch B_crit a larger batch cuts the steps nearly in proportion; above it, it mostly
  spends more tokens.
* Kaplan et al. 2020, "Scaling Laws for Neural Language Models" (arXiv 2001.08361), section 5.1,
  (the critical batch and the minimum steps as functions of the loss): the critical batch grows as the loss falls,
  B_crit(L) = B* / L^(1 / alpha_B) tokens with B* = 2e8 and alpha_B = 0.21; and the minimum steps to
  a loss for N non-embedding parameters, L(N, S_min) = (N_c / N)^alpha_N + (S_c / S_min)^alpha_S with
  N_c = 8.8e13, alpha_N = 0.076, S_c = 2.1e3, alpha_S = 0.76. The loss is theirs: nats per token on
  WebText2 with the GPT-2 tokenizer; for other data a user gives a measured critical batch
  (``critical_batch_tokens``) or the tokens to the target (``tokens``) instead.

A target is ``tokens`` (tokens to the target at a batch far below the critical one, E_min) or
``loss``; ``critical_batch_tokens`` (e.g. a measured gradient noise scale in tokens) overrides
Kaplan's B_crit(L).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.specs.model import ModelSpec

KAPLAN_B_STAR_TOKENS = 2.0e8
KAPLAN_ALPHA_B = 0.21
KAPLAN_N_C = 8.8e13
KAPLAN_ALPHA_N = 0.076
KAPLAN_S_C = 2.1e3
KAPLAN_ALPHA_S = 0.76


@dataclass(frozen=True)
class Target:
    tokens: float | None = None                 # E_min: tokens to the target at a small batch
    loss: float | None = None                   # a loss in Kaplan et al.'s units (nats per token)
    critical_batch_tokens: float | None = None  # measured B_crit (gradient noise scale), in tokens

    def __post_init__(self):
        if (self.tokens is None) == (self.loss is None):
            raise AdvisorError("a training target is either tokens (--target-tokens) or a loss (--target-loss), "
                               "exactly one of them")
        for name in ("tokens", "loss", "critical_batch_tokens"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise AdvisorError(f"target {name} must be a positive finite number, got {value!r}")
        if self.tokens is not None and self.critical_batch_tokens is None:
            raise AdvisorError("a target in tokens needs its critical batch (--critical-batch-tokens, e.g. a "
                               "measured gradient noise scale): Kaplan's B_crit(L) needs a loss")

    def to_dict(self) -> dict:
        return {k: v for k, v in (("tokens", self.tokens), ("loss", self.loss),
                                  ("critical_batch_tokens", self.critical_batch_tokens)) if v is not None}


@dataclass(frozen=True)
class Convergence:
    """What reaching the target takes at one global batch."""

    batch_tokens: float
    critical_batch_tokens: float
    minimum_tokens: float          # E_min
    tokens_to_target: float        # E(B)
    steps_to_target: float         # S(B)

    def to_dict(self) -> dict:
        return {"batch_tokens": self.batch_tokens, "critical_batch_tokens": self.critical_batch_tokens,
                "minimum_tokens": self.minimum_tokens, "tokens_to_target": self.tokens_to_target,
                "steps_to_target": self.steps_to_target}


def non_embedding_params(model: ModelSpec) -> float:
    """Kaplan's N: the parameters a token passes through, without the embedding and the LM head."""
    return float(model.num_active_params - model.embedding_params - model.lm_head_params)


def critical_batch_tokens(target: Target) -> float:
    if target.critical_batch_tokens is not None:
        return target.critical_batch_tokens
    return KAPLAN_B_STAR_TOKENS / target.loss ** (1.0 / KAPLAN_ALPHA_B)


def minimum_steps(model: ModelSpec, loss: float) -> float:
    """Kaplan's S_min for the loss: (S_c / S_min)^alpha_S = L - (N_c / N)^alpha_N."""
    floor = (KAPLAN_N_C / non_embedding_params(model)) ** KAPLAN_ALPHA_N
    if loss <= floor:
        raise AdvisorError(f"target loss {loss:g} is below what {model.name} reaches with unlimited data by "
                           f"Kaplan et al.'s L(N) = {floor:.3f}: no number of steps gets there")
    return KAPLAN_S_C / (loss - floor) ** (1.0 / KAPLAN_ALPHA_S)


def convergence(model: ModelSpec, target: Target, batch_tokens: float) -> Convergence:
    b_crit = critical_batch_tokens(target)
    e_min = target.tokens if target.tokens is not None else minimum_steps(model, target.loss) * b_crit
    return Convergence(batch_tokens=batch_tokens, critical_batch_tokens=b_crit, minimum_tokens=e_min,
                       tokens_to_target=e_min * (1.0 + batch_tokens / b_crit),
                       steps_to_target=e_min / b_crit * (1.0 + b_crit / batch_tokens))
