"""Where a job runs: the data centre's power usage effectiveness and the grid's carbon intensity
(priced in advisor.cost.carbon). The device's power and price per hour are the hardware profile's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.errors import AdvisorError
from advisor.specs.setting import setting

# PUE 1.58, the global average of the Uptime Institute's 2018 survey (as Carbontracker uses it: Anthony
# et al. 2020, arXiv 2007.03051); bounds for what a user gives.
DEFAULT_PUE = 1.58
MAX_PUE = 3.0
MAX_GRID_GCO2E_PER_KWH = 2000.0
GRID_GCO2E_PER_KWH = {     # Ember, yearly electricity data 2023 (ourworldindata.org/grapher/carbon-intensity-electricity)
    "world": 481.0, "china": 582.0, "india": 713.0, "germany": 381.0, "france": 56.0, "norway": 30.0,
    "brazil": 98.0, "canada": 170.0, "australia": 549.0,
}


def grid_intensity(text: str | float | None) -> float | None:
    """--grid-intensity: gCO2e/kWh as a number or a region name (GRID_GCO2E_PER_KWH)."""
    if text is None:
        return None
    key = str(text).strip().lower()
    if key in GRID_GCO2E_PER_KWH:
        return GRID_GCO2E_PER_KWH[key]
    try:
        value = float(key)
    except ValueError:
        raise AdvisorError(f"--grid-intensity: {str(text)[:40]!r} is neither gCO2e/kWh nor a region "
                           f"({', '.join(GRID_GCO2E_PER_KWH)})") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_GRID_GCO2E_PER_KWH):
        raise AdvisorError(f"--grid-intensity must be between 0 and {MAX_GRID_GCO2E_PER_KWH:g} gCO2e/kWh, got {value:g}")
    return value


def check_pue(pue: float) -> float:
    if not (math.isfinite(pue) and 1.0 <= pue <= MAX_PUE):
        raise AdvisorError(f"--pue must be between 1 and {MAX_PUE:g}, got {pue!r}")
    return float(pue)


@dataclass(frozen=True)
class Site:
    """Where it runs: the facility's overhead and the grid's carbon intensity."""

    pue: float = setting(
        DEFAULT_PUE, kind="positive_float", minimum=1.0, maximum=MAX_PUE, flags=("--pue",), group="site",
        help="the data centre's power usage effectiveness (default 1.58)",
        doc="The data centre's power usage effectiveness: facility energy over IT energy (advisor.cost.carbon).")
    grid_gco2e_per_kwh: float | None = setting(
        None, kind="non_negative_float", maximum=MAX_GRID_GCO2E_PER_KWH, optional=True, group="site",
        flags=("--grid-intensity",), parse=grid_intensity,
        help="grid carbon intensity: gCO2e/kWh or a region (world, china, india, germany, france, norway, ...)",
        doc="The grid's carbon intensity in gCO2e per kWh, for the emissions of training a token budget "
            "(needs train_tokens); a region name stands for Ember's 2023 yearly figure (GRID_GCO2E_PER_KWH).")
