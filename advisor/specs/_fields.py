"""Small validators shared by the YAML/JSON loaders. Each error names the origin, the key and a
short prefix of the value (advisor.specs.untrusted.prefix)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs.untrusted import load_tree, prefix

# Names (model.name, hardware.name, device.name, table names) reach exports, launch scripts, job
# names and reports: ASCII letters and digits first, then those, space and . _ - + / ( ) [ ] : @
# (enough for "H100-SXM5-80GB", "dgx-h100[inter25+mem80]", "meta-llama/Llama-3-8B",
# "Intel(R) Xeon(R) CPU @ 2.20GHz"), so that no quote, backslash, $, `, ;, &, |, <, >, #, =, {},
# *, ? or control character can carry a shell, Python, TOML or YAML construct.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+\-/()\[\]:@]*")
NAME_CHARS_TEXT = "letters, digits, space and . _ - + / ( ) [ ] : @, starting with a letter or digit"


def read_mapping(path: Path, kind: str = "file") -> dict[str, Any]:
    """Read, parse and check (advisor.specs.untrusted) a YAML or JSON file whose top level must be a mapping."""
    data = load_tree(path, kind)
    if not isinstance(data, dict):
        raise AdvisorError(f"{path}: the top level must be a mapping of keys to values, not {type(data).__name__}")
    return data


def check_keys(data: dict[str, Any], origin: str, required: Iterable[str], optional: Iterable[str] = ()) -> None:
    """Refuse unknown keys and missing required keys."""
    required, optional = set(required), set(optional)
    if not isinstance(data, dict):
        raise AdvisorError(f"{origin}: expected a mapping, got {prefix(data)}")
    unknown = sorted(set(data) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise AdvisorError(f"{origin}: unknown key {prefix(unknown[0])} = {prefix(data[unknown[0]])} (allowed: {allowed})")
    missing = sorted(required - set(data))
    if missing:
        raise AdvisorError(f"{origin}: missing required key '{missing[0]}'")


def _integer(data: dict[str, Any], key: str, origin: str, default: int | None, minimum: int, maximum: int | None,
             what: str) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AdvisorError(f"{origin}: key '{key}' must be a {what} integer, got {prefix(value)}")
    bound = limits.MAX_INT if maximum is None else maximum
    if value > bound:
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)} exceeds the bound {bound:,} advisor accepts "
                           f"(advisor/specs/limits.py)")
    return value


def positive_int(data: dict[str, Any], key: str, origin: str, default: int | None = None,
                 maximum: int | None = None) -> int:
    """A positive integer, at most `maximum` (limits.MAX_INT when not given)."""
    return _integer(data, key, origin, default, 1, maximum, "positive")


def non_negative_int(data: dict[str, Any], key: str, origin: str, default: int | None = None,
                     maximum: int | None = None) -> int:
    return _integer(data, key, origin, default, 0, maximum, "non-negative")


def _number(data: dict[str, Any], key: str, origin: str, default: float | None, what: str) -> float:
    value = data.get(key, default)
    if isinstance(value, str):
        # YAML 1.1 reads 6.74e9 (no dot before e, no exponent sign) as a string: accept it as a number.
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdvisorError(f"{origin}: key '{key}' must be a {what} number, got {prefix(value)}")
    if not math.isfinite(value):
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)}: infinite or undefined numbers are not accepted")
    if value > limits.MAX_QUANTITY:
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)} exceeds the bound {limits.MAX_QUANTITY:g} "
                           f"advisor accepts (advisor/specs/limits.py)")
    return float(value)


def positive_float(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    """A finite number in [limits.MIN_POSITIVE, limits.MAX_QUANTITY]."""
    value = _number(data, key, origin, default, "positive")
    if not value >= limits.MIN_POSITIVE:
        raise AdvisorError(f"{origin}: key '{key}' must be a positive number of at least {limits.MIN_POSITIVE:g}, "
                           f"got {prefix(value)}")
    return value


def non_negative_float(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    value = _number(data, key, origin, default, "non-negative")
    if value < 0:
        raise AdvisorError(f"{origin}: key '{key}' must be a non-negative number, got {prefix(value)}")
    return value


def fraction(data: dict[str, Any], key: str, origin: str, default: float | None = None) -> float:
    value = positive_float(data, key, origin, default)
    if value > 1.0:
        raise AdvisorError(f"{origin}: key '{key}' must be a fraction in (0, 1], got {value!r}")
    return value


def choice(data: dict[str, Any], key: str, origin: str, options: Iterable[str], default: str | None = None) -> str:
    options = tuple(options)
    value = data.get(key, default)
    if value not in options:
        raise AdvisorError(f"{origin}: key '{key}' must be one of {', '.join(map(str, options))}, got {prefix(value)}")
    return value


def boolean(data: dict[str, Any], key: str, origin: str, default: bool | None = None) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise AdvisorError(f"{origin}: key '{key}' must be true or false, got {prefix(value)}")
    return value


def text(data: dict[str, Any], key: str, origin: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise AdvisorError(f"{origin}: key '{key}' must be a non-empty string, got {prefix(value)}")
    return value


def name(data: dict[str, Any], key: str, origin: str, default: str | None = None) -> str:
    """A name: at most limits.MAX_NAME_CHARS characters of NAME_PATTERN."""
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise AdvisorError(f"{origin}: key '{key}' must be a non-empty name, got {prefix(value)}")
    if len(value) > limits.MAX_NAME_CHARS:
        raise AdvisorError(f"{origin}: key '{key}' is a name of {len(value):,} characters, more than "
                           f"{limits.MAX_NAME_CHARS} ({prefix(value)})")
    if not NAME_PATTERN.fullmatch(value):
        bad = next((c for c in value if not NAME_PATTERN.fullmatch("a" + c)), value[:1])
        raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)} has the character {bad!r}; a name may hold "
                           f"{NAME_CHARS_TEXT}")
    return value


def resolve_bundled(name_or_path: str, folder: Path, kind: str) -> Path:
    """A bundled name (models/NAME.yaml) or a path to a file."""
    candidate = Path(name_or_path)
    try:
        exists = candidate.exists()
    except (OSError, ValueError):   # a name too long for the file system, or with a NUL byte
        exists = False
    if candidate.suffix in (".yaml", ".yml", ".json") or exists:
        if not exists or not candidate.is_file():
            raise AdvisorError(f"{kind} file not found: {prefix(name_or_path)}")
        return candidate
    bundled = folder / f"{name_or_path}.yaml"
    if NAME_PATTERN.fullmatch(name_or_path) and len(name_or_path) <= limits.MAX_NAME_CHARS and bundled.is_file():
        return bundled
    names = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
    raise AdvisorError(f"unknown {kind} {prefix(name_or_path)}: give a path or one of: {names}")
