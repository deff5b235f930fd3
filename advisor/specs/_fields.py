"""Small validators shared by the YAML/JSON loaders. Each error names the origin, the key and the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import yaml

from advisor.errors import AdvisorError


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise AdvisorError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise AdvisorError(f"{path}: malformed {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise AdvisorError(f"{path}: the top level must be a mapping of keys to values, not {type(data).__name__}")
    return data


def check_keys(data: dict[str, Any], origin: str, required: Iterable[str], optional: Iterable[str] = ()) -> None:
    """Refuse unknown keys and missing required keys."""
    required, optional = set(required), set(optional)
    if not isinstance(data, dict):
        raise AdvisorError(f"{origin}: expected a mapping, got {data!r}")
    unknown = sorted(set(data) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise AdvisorError(f"{origin}: unknown key '{unknown[0]}' = {data[unknown[0]]!r} (allowed: {allowed})")
    missing = sorted(required - set(data))
    if missing:
        raise AdvisorError(f"{origin}: missing required key '{missing[0]}'")


def positive_int(data: dict[str, Any], key: str, origin: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise AdvisorError(f"{origin}: key '{key}' must be a positive integer, got {value!r}")
    return value


def non_negative_int(data: dict[str, Any], key: str, origin: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AdvisorError(f"{origin}: key '{key}' must be a non-negative integer, got {value!r}")
    return value


def positive_float(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if isinstance(value, str):
        # YAML 1.1 reads 6.74e9 (no dot before e, no exponent sign) as a string: accept it as a number.
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise AdvisorError(f"{origin}: key '{key}' must be a positive number, got {value!r}")
    return float(value)


def non_negative_float(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise AdvisorError(f"{origin}: key '{key}' must be a non-negative number, got {value!r}")
    return float(value)


def fraction(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    value = positive_float(data, key, origin, default)
    if value > 1.0:
        raise AdvisorError(f"{origin}: key '{key}' must be a fraction in (0, 1], got {value!r}")
    return value


def choice(data: dict[str, Any], key: str, origin: str, options: Iterable[str], default: str | None = None) -> str:
    options = tuple(options)
    value = data.get(key, default)
    if value not in options:
        raise AdvisorError(f"{origin}: key '{key}' must be one of {', '.join(options)}, got {value!r}")
    return value


def boolean(data: dict[str, Any], key: str, origin: str, default: bool | None = None) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise AdvisorError(f"{origin}: key '{key}' must be true or false, got {value!r}")
    return value


def text(data: dict[str, Any], key: str, origin: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise AdvisorError(f"{origin}: key '{key}' must be a non-empty string, got {value!r}")
    return value


def resolve_bundled(name_or_path: str, folder: Path, kind: str) -> Path:
    """A bundled name (models/NAME.yaml) or a path to a file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml", ".json") or candidate.exists():
        if not candidate.is_file():
            raise AdvisorError(f"{kind} file not found: {name_or_path}")
        return candidate
    bundled = folder / f"{name_or_path}.yaml"
    if bundled.is_file():
        return bundled
    names = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
    raise AdvisorError(f"unknown {kind} '{name_or_path}': give a path or one of: {names}")
