"""Write fitted constants into a bundled profile's YAML text, keeping every other line and comment.

The fitted keys (device.matmul_efficiency, device.attention_efficiency, device.memory_efficiency,
device.launch_overhead_us, node.intra_node.efficiency, inter_node.efficiency) are replaced in place;
a marker comment above the device's curves names the fit. The file is written atomically.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

MARK = "# Fitted by benchmarks/fit_profiles.py"


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index after the block that starts at line `start` (lines indented deeper than `indent`)."""
    i = start + 1
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        i += 1
    return i


def _find(lines: list[str], key: str, indent: int, after: int = 0, before: int | None = None) -> int | None:
    prefix = " " * indent + key + ":"
    for i in range(after, len(lines) if before is None else before):
        if lines[i].startswith(prefix):
            return i
    return None


def _number(value: float, digits: int = 4) -> str:
    """`digits` significant digits, never in exponent notation (which YAML 1.1 reads back as a string)."""
    text = f"{float(f'{value:.{digits}g}'):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _curve_lines(key: str, curves: dict[str, list[list[float]]], indent: int) -> list[str]:
    pad = " " * indent
    out = [f"{pad}{key}:"]
    for name, points in curves.items():
        pts = ", ".join(f"[{_number(x, 6)}, {_number(y)}]" for x, y in points)
        out.append(f"{pad}  {name}: [{pts}]")
    return out


def _set_value(lines: list[str], index: int, value: float) -> None:
    line = lines[index]
    head, _, rest = line.partition(":")
    comment = ""
    if "#" in rest:
        comment = "  " + rest[rest.index("#"):]
    lines[index] = f"{head}: {_number(value)}{comment}"


def fitted_text(text: str, raw: dict[str, Any], note: str) -> str:
    """The profile text with the fitted keys of `raw` (a profile mapping) written into it."""
    lines = text.split("\n")
    dev = _find(lines, "device", 0)
    dev_end = _block_end(lines, dev, 0)
    # drop an earlier marker and the curve blocks, then write the new ones where matmul_efficiency was
    for key in ("attention_efficiency", "matmul_efficiency"):
        i = _find(lines, key, 2, dev, dev_end)
        if i is not None:
            end = _block_end(lines, i, 2)
            while i > dev and lines[i - 1].strip().startswith(MARK):
                i -= 1
            del lines[i:end]
            dev_end -= end - i
            insert_at = i
    device = raw["device"]
    block = [f"  {MARK}: {note}"]
    block += _curve_lines("matmul_efficiency", device["matmul_efficiency"], 2)
    block += _curve_lines("attention_efficiency", device["attention_efficiency"], 2)
    lines[insert_at:insert_at] = block
    dev_end += len(block)
    for key in ("memory_efficiency", "launch_overhead_us"):
        if key in device:
            i = _find(lines, key, 2, dev, dev_end)
            if i is None:
                lines.insert(dev_end, f"  {key}: {_number(device[key])}")
                dev_end += 1
            else:
                _set_value(lines, i, device[key])
    node = _find(lines, "node", 0)
    intra = _find(lines, "intra_node", 2, node)
    i = _find(lines, "efficiency", 4, intra, _block_end(lines, intra, 2))
    if i is not None:
        _set_value(lines, i, raw["node"]["intra_node"]["efficiency"])
    inter = _find(lines, "inter_node", 0)
    i = _find(lines, "efficiency", 2, inter, _block_end(lines, inter, 0))
    if i is not None:
        _set_value(lines, i, raw["inter_node"]["efficiency"])
    return "\n".join(lines)


def with_calibration(text: str, calibration: dict[str, Any]) -> str:
    """The profile text with its top-level calibration mapping replaced (appended at the end)."""
    lines = text.rstrip("\n").split("\n")
    i = _find(lines, "calibration", 0)
    if i is not None:
        end = _block_end(lines, i, 0)
        while i > 0 and lines[i - 1].startswith("# Calibrated region"):
            i -= 1
        del lines[i:end]
    lines.append("# Calibrated region: the measured runs behind the fitted constants (advisor.cost.confidence)")
    lines.append("calibration:")
    for key, value in calibration.items():
        lines.append(f"  {key}: {_flow(value)}")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace('"', "'") + '"'
    return f"{value:g}" if isinstance(value, float) else str(value)


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder, then rename over the target (keeping the
    target's permissions; mkstemp creates the file readable by its owner only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
