"""What a launch configuration pins (advisor.importers), by the field names of advisor's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import limits


@dataclass(frozen=True)
class Imported:
    """What a launch configuration pins, by the field names of advisor's settings."""

    source: str
    """The file read (for messages)."""
    framework: str
    """The framework record that runs it (advisor.specs.frameworks)."""
    job: dict[str, Any] = field(default_factory=dict)
    """TrainingJob field -> value."""
    strategy: dict[str, Any] = field(default_factory=dict)
    """Strategy field -> value."""
    nodes: int | None = None
    """Nodes the launcher starts (torchrun --nnodes), None when the file does not say."""
    devices: int | None = None
    """Devices in all (nodes x processes per node), None when the file does not say."""
    model: dict[str, Any] = field(default_factory=dict)
    """ModelSpec field -> value the file states (num_layers, hidden_size, ...)."""


def flatten(doc: dict, prefix_: str = "") -> dict[str, Any]:
    """A nested config as dotted paths to its values ("zero_optimization.stage" -> 3); an empty mapping stays a
    value of its own path."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix_}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def refuse(source: str, key: str, value: Any, why: str = "advisor does not price it") -> AdvisorError:
    """The one-sentence refusal of a config key, naming the file, the key and its value."""
    from advisor.specs.untrusted import prefix

    return AdvisorError(f"{where(source)}: {key} = {prefix(str(value))}: {why}")


def where(source: str) -> str:
    """``--from FILE`` as messages name it (the path whole up to 300 characters, quoted and escaped)."""
    return f"--from {source[:300]!r}"


def read_text(path: str | Path) -> str:
    p = Path(path)
    try:
        if p.stat().st_size > limits.MAX_YAML_BYTES:
            raise AdvisorError(f"{where(str(path))}: larger than {limits.MAX_YAML_BYTES} bytes")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AdvisorError(f"{where(str(path))}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AdvisorError(f"{where(str(path))}: cannot read it: {exc}") from None
