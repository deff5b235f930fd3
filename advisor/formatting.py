"""Human-readable figures shared by the rich reports (durations, money, energy)."""

from __future__ import annotations


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
