"""Energy and emissions of a training run: utilisation-dependent device power, the rest of each node,
the data centre's overhead (PUE) and the grid's carbon intensity.

* Device power rises with the compute it does: from a floor (the device held by the job, memory
  resident, clocks up, no compute: an A40 in P0 with a model loaded draws 110 W of its 300 W, against
  30 W fully idle; NVIDIA/open-gpu-kernel-modules issue #874) to its TDP (the profile's
  ``power_watts``) when it computes at the profile's best measured GEMM efficiency. In between,
  linearly in the achieved compute fraction (hardware FLOPs utilisation, recomputation included):
  P = TDP x (FLOOR + (1 - FLOOR) x min(1, HFU / best GEMM efficiency)). Measured nodes stay below
  their rating: an 8 x H100 node peaked at 8.4 kW of its 10.2 kW while training (Latif et al. 2024,
  arXiv 2412.08602), which this model does not exceed.
* The rest of a node (CPUs, NICs, NVSwitches, fans): the profile's ``host: power_watts``, per node,
  shared by its devices (a job on part of a node pays its devices' share), when given (bundled DGX profiles: the datasheet's system maximum less the GPUs' TDP, an upper
  bound); not counted otherwise.
* Facility: energy x PUE (default 1.58, the global average of the Uptime Institute's 2018 survey, the
  figure Carbontracker uses: Anthony et al. 2020, arXiv 2007.03051).
* Emissions: energy x the grid's intensity in gCO2e/kWh, given as a number or a region
  (GRID_GCO2E_PER_KWH: Ember's 2023 generation intensities, as Our World in Data publishes them).
"""

from __future__ import annotations


import numpy as np

from advisor.specs.hardware import HardwareProfile
from advisor.specs.site import DEFAULT_PUE, GRID_GCO2E_PER_KWH, check_pue, grid_intensity  # noqa: F401 (re-exported)

__all__ = ["DEFAULT_PUE", "GRID_GCO2E_PER_KWH", "check_pue", "cluster_power_w", "device_power_w", "emissions_tco2e",
           "energy_kwh", "grid_intensity"]

IN_JOB_FLOOR = 110.0 / 300.0


def device_power_w(hw: HardwareProfile, dtype: str, hfu):
    """Watts per device at the achieved compute fraction (array); None without the profile's power_watts."""
    if hw.power_watts is None:
        return None
    best = max(eff for _, eff in hw.device.gemm_curve(dtype))
    busy = np.minimum(1.0, np.asarray(hfu, dtype=float) / best)
    return hw.power_watts * (IN_JOB_FLOOR + (1.0 - IN_JOB_FLOOR) * busy)


def cluster_power_w(hw: HardwareProfile, dtype: str, devices: int, hfu):
    """Watts of the job's devices and (when the profile gives it) their share of the rest of the nodes."""
    device = device_power_w(hw, dtype, hfu)
    if device is None:
        return None
    # the rest of the node in proportion to the devices the job holds (a job on part of a node pays its share)
    return devices * device + devices / hw.node.devices_per_node * (hw.host.power_watts or 0.0)


def energy_kwh(power_w, seconds, pue: float):
    """Facility energy in kWh for IT power (W) over a duration."""
    return np.asarray(power_w, dtype=float) * np.asarray(seconds, dtype=float) / 3.6e6 * pue


def emissions_tco2e(kwh, grid_gco2e_per_kwh: float):
    return np.asarray(kwh, dtype=float) * grid_gco2e_per_kwh / 1e6
