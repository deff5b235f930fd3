"""Bandwidths written with their unit ("200Gb/s", "25GB/s", "900 GB/s", "400Gbps", "3.35TB/s").

Profiles keep bandwidth in ``*_gbps`` keys, whose unit is GB/s (10**9 bytes per second, DESIGN.md
"Hardware profile"). Network links are sold in bits (a "200 Gb/s" HDR NIC moves 25 GB/s) and memory
in bytes, so a plain number invites the factor-of-eight mistake. A string value names its unit and is
converted here; a plain number keeps meaning GB/s. The case of the B says bytes or bits (IEC 80000-13
symbols: B byte, b or bit bit; SI prefixes k M G T are powers of 1000, Ki Mi Gi Ti of 1024); a unit
whose case leaves that open ("gbps") is refused.
"""

from __future__ import annotations

import math
import re
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs.untrusted import prefix

_PREFIX = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
# unit -> bytes per symbol (B/s and Bps count bytes; b/s, bps and bit/s count bits: 1/8 byte)
_SYMBOL = {"B/s": 1.0, "Bps": 1.0, "b/s": 0.125, "bps": 0.125, "bit/s": 0.125}
_VALUE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*")
UNITS_TEXT = "GB/s, Gb/s, Gbps, GBps, Gbit/s, MB/s, TB/s, GiB/s (bytes: B, bits: b or bit)"


def bandwidth_gbps(value: Any, key: str, origin: str) -> Any:
    """GB/s from a string with a unit; any other value unchanged (the loaders check numbers)."""
    if not isinstance(value, str):
        return value
    try:                       # a number written as a string (YAML 1.1 reads 6.74e9 so) stays GB/s
        float(value)
        return value
    except ValueError:
        pass
    match = _VALUE.fullmatch(value)
    if match is None:
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)} is not a bandwidth: give GB/s as a number, or a "
                           f"number and a unit ({UNITS_TEXT})")
    number, unit = float(match.group(1)), match.group(2)
    scale = None
    for symbol, bytes_per in _SYMBOL.items():
        head = unit[: -len(symbol)] if unit.endswith(symbol) else None
        if head is not None and head in _PREFIX:
            scale = _PREFIX[head] * bytes_per / 1e9
            break
    if scale is None:
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)}: unknown unit {prefix(unit)}; use one of "
                           f"{UNITS_TEXT} (the case of B tells bytes from bits)")
    gbps = float(f"{number * scale:.12g}")    # 2.039 TB/s is 2039 GB/s, not 2039.0000000000002
    if not math.isfinite(gbps):
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)}: infinite or undefined numbers are not accepted")
    return gbps


# Where a profile holds bandwidths: (path of mappings, keys); "*" stands for every operation of a
# `collectives` mapping (advisor.specs.hardware._per_op).
_PLACES = (
    (("device",), ("memory_bandwidth_gbps",)),
    (("node", "intra_node"), ("bandwidth_gbps", "cross_group_bandwidth_gbps")),
    (("node", "intra_node", "collectives", "*"), ("bandwidth_gbps",)),
    (("inter_node",), ("bandwidth_gbps",)),
    (("inter_node", "collectives", "*"), ("bandwidth_gbps",)),
    (("host",), ("pcie_bandwidth_gbps", "memory_bandwidth_gbps")),
)


def normalize_bandwidths(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A copy of a profile mapping whose bandwidth strings with units are GB/s numbers.

    Only the mappings on the way to a converted key are copied; anything that is not where a
    bandwidth belongs is left for the profile loader to check and report."""
    out = dict(data)
    for path, keys in _PLACES:
        _convert(out, path, keys, origin)
    return out


def _convert(node: dict[str, Any], path: tuple[str, ...], keys: tuple[str, ...], where: str) -> None:
    if not path:
        for key in keys:
            if key in node:
                node[key] = bandwidth_gbps(node[key], key, where)
        return
    names = list(node) if path[0] == "*" else [path[0]]
    for name in names:
        child = node.get(name)
        if isinstance(child, dict):
            node[name] = dict(child)
            _convert(node[name], path[1:], keys, f"{where}: {name}")
