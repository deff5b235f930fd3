"""Human-readable figures shared by the rich reports (durations, money, energy)."""

from __future__ import annotations

import math


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds:,.1f} s"


def money(usd: float | None) -> str:
    if usd is None:
        return "-"
    return f"${usd / 1e6:,.2f}M" if usd >= 1e6 else f"${usd:,.0f}"


def energy(kwh: float | None) -> str:
    if kwh is None:
        return "-"
    return f"{kwh / 1000.0:,.1f} MWh" if kwh >= 1000 else f"{kwh:,.0f} kWh"


def count(n: float | None) -> str:
    """A large count with three significant digits and an SI-style suffix: 70.6B, 334M, 1.01T."""
    if n is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def step_time(seconds: float | None) -> str:
    """A step time in seconds with three significant digits and no exponent (0.0123, 1.23, 123, 1235):
    the one format of every step-time column and figure (estimate, recommend, whatif)."""
    if seconds is None:
        return "-"
    if seconds <= 0 or not math.isfinite(seconds):
        return f"{seconds:g}"
    rounded = float(f"{seconds:.3g}")       # 0.9996 -> 1.0, so that it prints 1.00, not 1.000
    decimals = max(0, 2 - math.floor(math.log10(rounded)))
    return f"{rounded:.{decimals}f}"


def training_figures(e) -> list[str]:
    """Cost, energy and emissions to train the token budget, those an estimate has (each a string)."""
    out = []
    if e.cost_to_train_usd is not None:
        out.append(money(e.cost_to_train_usd))
    if e.energy_to_train_kwh is not None:
        out.append(energy(e.energy_to_train_kwh))
    if e.emissions_to_train_tco2e is not None:
        out.append(f"{e.emissions_to_train_tco2e:.3g} tCO2e")
    return out


def band_line(what: str, e) -> str | None:
    """What the measured throughput of a plan is expected to be (its error band, advisor.cost.band)."""
    if e.band is None or e.tokens_per_s <= 0:
        return None
    low, high = e.band.tokens_per_s(e.tokens_per_s)
    outside = f", {e.band.parts} part(s) outside the calibrated region" if e.band.parts else ""
    return (f"{what}: measured throughput expected in {low:,.0f}-{high:,.0f} tokens/s (error band "
            f"{e.band.low:+.0%} to {e.band.high:+.0%} from leave-one-source-out residuals{outside})")
