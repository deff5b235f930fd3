"""Efficiency curves of a hardware profile's device, and the reference curve for a device without one.

``matmul_efficiency`` is the achievable fraction of peak by GEMM work per call, ``attention_efficiency``
the fraction of peak of a fused attention kernel by sequence length (advisor.specs.hardware.DeviceSpec).
A profile may leave ``matmul_efficiency`` out: the device then takes the curve of the bundled profile of
its device class (REFERENCE_CLASSES, matched on the device name), and the profile carries a note that says
so. Such a curve is an assumption about a different chip of the same vendor stack, not a measurement:
``advisor calibrate`` measures a device's own.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs.frameworks import ATTENTION_KERNELS

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")

# (class, device-name pattern, bundled profile whose curve stands in), first match wins. The patterns
# follow the vendors' product names (NVIDIA data-center GPU names: V100, A100/A800/A30/A40/A10, L40/L4,
# H100/H200/H800/H20/GH200, B100/B200/GB200, B300/GB300; Huawei Ascend 910, 910B/910C). Each generation takes
# the bundled profile of the same architecture where there is one (their curves are fitted to measured
# runs, see each profile's "Fitted by" line), and other NVIDIA GPUs the A100 (Ampere) curve.
REFERENCE_CLASSES = (
    ("Ascend 910B/910C NPUs", r"910\s*[bc]", "ascend-910b"),
    ("Ascend NPUs", r"ascend|910", "ascend-910"),
    ("NVIDIA Blackwell Ultra GPUs", r"(?<![a-z0-9])g?b300(?![0-9])", "dgx-b300"),
    ("NVIDIA Blackwell GPUs", r"(?<![a-z0-9])g?b[12]00(?![0-9])", "dgx-b200"),
    ("NVIDIA Hopper GPUs", r"(?<![a-z0-9])(g?h[12]00|h800|h20)(?![0-9])", "dgx-h100"),
    ("NVIDIA Volta GPUs", r"(?<![a-z0-9])v100(?![0-9])", "dgx-v100"),
    ("NVIDIA data-center GPUs", r"nvidia|tesla|(?<![a-z0-9])(a100|a800|a40|a30|a10|l40s?|l4)(?![0-9])", "dgx-a100-80g"),
)


def reference_curve(device_name: str, profiles_dir: Path, origin: str) -> tuple[Any, str]:
    """(the raw matmul_efficiency of the device's reference class, a note naming it)."""
    lowered = device_name.lower()
    for label, pattern, profile in REFERENCE_CLASSES:
        if re.search(pattern, lowered):
            path = profiles_dir / f"{profile}.yaml"
            device = f.read_mapping(path, "hardware profile").get("device") or {}
            curve = device.get("matmul_efficiency")
            if curve is None:
                raise AdvisorError(f"{path}: the reference profile for {label} has no matmul_efficiency")
            note = (f"{origin}: device.matmul_efficiency not given: using the GEMM efficiency curve of the bundled "
                    f"profile {profile} ({device.get('name', profile)}), the reference for {label}; measure this "
                    f"device's own with advisor calibrate")
            return curve, note
    classes = "; ".join(f"{label}: {profile}" for label, _, profile in REFERENCE_CLASSES)
    raise AdvisorError(f"{origin}: missing required key 'matmul_efficiency', and the device name "
                       f"{f.prefix(device_name)} matches no reference device class ({classes}); give the curve")


def efficiency_curve(value: Any, origin: str, name: str = "matmul_efficiency",
                      unit: str = "gflop") -> tuple[tuple[float, float], ...]:
    key = f"{origin}: key '{name}'"
    if not isinstance(value, list) or not value:
        raise AdvisorError(f"{key} must be a non-empty list of [{unit}, efficiency] pairs, got {f.prefix(value)}")
    points = []
    for item in value:
        ok = isinstance(item, (list, tuple)) and len(item) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in item
        )
        if not ok or item[0] <= 0 or not 0 < item[1] <= 1:
            raise AdvisorError(f"{key} has a bad point {f.prefix(item)}: want [{unit} > 0, 0 < efficiency <= 1]")
        points.append((float(item[0]), float(item[1])))
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise AdvisorError(f"{key} must list {unit} in increasing order, got {f.prefix(value)}")
    return tuple(points)


def attention_curves(value: Any, origin: str):
    """((kernel, curve), ...) from a kernel -> [[tokens, efficiency], ...] mapping (optional)."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        raise AdvisorError(f"{origin}: key 'attention_efficiency' must map attention kernels "
                           f"({', '.join(ATTENTION_KERNELS)}) to [[tokens, efficiency], ...] curves, got {f.prefix(value)}")
    out = []
    for kernel, curve in value.items():
        if kernel not in ATTENTION_KERNELS:
            raise AdvisorError(f"{origin}: attention_efficiency has unknown kernel '{kernel}' (known: {', '.join(ATTENTION_KERNELS)})")
        out.append((kernel, efficiency_curve(curve, origin, f"attention_efficiency: {kernel}", "tokens")))
    return tuple(out)


def gemm_curves(value: Any, origin: str):
    """(default curve, ((dtype, curve), ...)) from a list or a dtype -> list mapping."""
    if not isinstance(value, dict):
        return efficiency_curve(value, origin), ()
    if not value:
        raise AdvisorError(f"{origin}: key 'matmul_efficiency' must not be an empty mapping")
    curves = []
    for dtype, curve in value.items():
        if dtype not in DTYPES:
            raise AdvisorError(f"{origin}: matmul_efficiency has unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
        curves.append((dtype, efficiency_curve(curve, origin, f"matmul_efficiency: {dtype}")))
    return curves[0][1], tuple(curves)
