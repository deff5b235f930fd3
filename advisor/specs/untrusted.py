"""Reading files that a user hands to advisor: bounded, parsed safely, and checked once.

Every model, hardware profile, plan and operator-strategy file goes through ``load_tree``:

* the file is at most limits.MAX_YAML_BYTES or MAX_JSON_BYTES (checked with stat, and at most that
  many bytes plus one are read, so a file that grows or lies about its size is still refused) and
  is UTF-8 text;
* YAML is parsed with PyYAML's safe loader (no Python objects), nesting deeper than
  limits.MAX_DEPTH is refused before composing recurses that deep (Python's recursion limit, or
  libyaml's C stack); JSON
  refuses ``NaN``/``Infinity`` (Python's json accepts them, RFC 8259 section 6 does not) and
  numbers that overflow to infinity;
* ``check_tree`` then walks the parsed value once, iteratively: at most limits.MAX_VALUES values with
  every YAML alias expanded where it is used (a billion-laughs file is refused after a million
  values instead of being expanded later by a repr or a JSON writer), mapping keys are strings,
  only mappings, lists, strings, numbers, booleans and null (no YAML dates, binary or sets), finite
  floats, integers within limits.MAX_INT, and strings without control characters (C0, DEL, C1
  including NEL, the Unicode line and paragraph separators and the bidirectional overrides that can
  make text display differently from what it is; CVE-2021-42574, "Trojan Source").

Errors name the file and the key path and quote at most a short prefix of the bad value.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from advisor.errors import AdvisorError
from advisor.specs import limits

# C0 controls (tab and newline included), DEL, C1 controls (NEL U+0085 included), the line and
# paragraph separators, and the bidirectional embedding/override/isolate controls.
_CONTROL = re.compile("[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_PREFIX_CHARS = 40


def prefix(value: Any) -> str:
    """A short, safe quotation of a value for an error message (repr of at most a 40-character prefix)."""
    if isinstance(value, str):
        return repr(value[:_PREFIX_CHARS]) + ("..." if len(value) > _PREFIX_CHARS else "")
    if isinstance(value, (dict, list)):
        items = list(value.items()) if isinstance(value, dict) else value
        flat = [x for item in items for x in (item if isinstance(value, dict) else (item,))]
        if len(value) <= 8 and all(isinstance(x, (str, float, bool, type(None))) or
                                   (isinstance(x, int) and x.bit_length() <= 128) for x in flat):
            text = repr(value)
            return text[:_PREFIX_CHARS] + ("..." if len(text) > _PREFIX_CHARS else "")
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    if isinstance(value, int) and value.bit_length() > 128:   # repr of a huge int is slow or refused
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value) if isinstance(value, (int, float, bool)) or value is None else type(value).__name__
    return text[:_PREFIX_CHARS] + ("..." if len(text) > _PREFIX_CHARS else "")


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:.1f}".rstrip("0").rstrip(".") + " MiB"


def read_text(path: Path, kind: str = "file", limit: int = limits.MAX_JSON_BYTES) -> str:
    """The file's text: refused when unreadable, larger than `limit` bytes, or not UTF-8."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise AdvisorError(f"{path}: the {kind} is {_mib(size)} ({size:,} bytes), more than the {_mib(limit)} "
                               f"advisor reads")
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise AdvisorError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise AdvisorError(f"{path}: the {kind} is more than the {_mib(limit)} advisor reads")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AdvisorError(f"{path}: the {kind} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                           f"{exc.start}); save it as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


class _DepthLimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a bound on nesting, checked while the document is composed
    (the composer recurses once per level; the parser and scanner below it do not)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > limits.MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise AdvisorError(f"nesting deeper than {limits.MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _parse_yaml(text: str) -> Any:
    """PyYAML's safe loading. With libyaml (about 3x faster), the nesting is first measured on the
    C parser's event stream (iterative), since libyaml's composer recurses in C once per level;
    without it, the pure-Python loader counts levels as it composes."""
    if getattr(yaml, "__with_libyaml__", False):
        depth = 0
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, _OPEN):
                depth += 1
                if depth > limits.MAX_DEPTH:
                    raise AdvisorError(f"nesting deeper than {limits.MAX_DEPTH} levels (line {event.start_mark.line + 1})")
            elif isinstance(event, _CLOSE):
                depth -= 1
        return yaml.load(text, Loader=yaml.CSafeLoader)
    loader = _DepthLimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _refuse_constant(name: str) -> float:
    raise ValueError(f"the JSON constant {name} is not a number advisor accepts")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:_PREFIX_CHARS]} overflows a 64-bit float")
    return value


def parse(text: str, origin: str, fmt: str) -> Any:
    """YAML or JSON text -> plain Python values (fmt 'json' or 'yaml'), nesting and constants bounded."""
    try:
        if fmt == "json":
            return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        return _parse_yaml(text)
    except AdvisorError as exc:
        raise AdvisorError(f"{origin}: {exc}") from None
    except RecursionError:
        raise AdvisorError(f"{origin}: nesting deeper than {limits.MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        text = ' '.join(str(exc).split())
        if "nesting depth" in text:
            # PyYAML >= 6.0.4's scanner bounds flow nesting itself (scanning ahead of the composer's count)
            raise AdvisorError(f"{origin}: nesting deeper than {limits.MAX_DEPTH} levels (PyYAML: {text[:200]})") from None
        raise AdvisorError(f"{origin}: malformed YAML: {text[:300]}") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # json.JSONDecodeError, refused constants, int digits beyond Python's limit; PyYAML's
        # constructors fail so on some explicitly tagged values (!!timestamp on a non-date)
        raise AdvisorError(f"{origin}: malformed {fmt.upper()}: {' '.join(str(exc).split())[:300]}") from None


def _where(path: tuple) -> str:
    """A key path for a message, e.g. device.peak_tflops.bf16 or stages[3]; odd keys quoted by prefix()."""
    out = ""
    for part in path:
        if isinstance(part, str) and (len(part) > _PREFIX_CHARS or _CONTROL.search(part) or "'" in part):
            part = prefix(part)
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def check_tree(data: Any, origin: str) -> None:
    """Walk a parsed document once (iteratively) and refuse what no advisor input may hold."""
    stack: list[tuple[Any, tuple, int]] = [(data, (), 0)]
    seen = 0
    while stack:
        value, path, depth = stack.pop()
        seen += 1
        if seen > limits.MAX_VALUES:
            raise AdvisorError(f"{origin}: more than {limits.MAX_VALUES:,} values once YAML aliases are "
                               f"expanded (an alias bomb?); near key '{_where(path)}'")
        if depth > limits.MAX_DEPTH:
            raise AdvisorError(f"{origin}: key '{_where(path)}' nests deeper than {limits.MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise AdvisorError(f"{origin}: key '{_where(path)}' has a key {prefix(key)} that is not "
                                       f"a string (quote it)")
                _check_string(key, path + (key,), origin, limits.MAX_NAME_CHARS, "key")
                stack.append((item, path + (key,), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, path + (i,), depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, path, origin, limits.MAX_TEXT_CHARS, "value")
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if abs(value) > limits.MAX_INT:
                raise AdvisorError(f"{origin}: key '{_where(path)}' = {prefix(value)} exceeds the largest "
                                   f"integer advisor accepts (2**53)")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise AdvisorError(f"{origin}: key '{_where(path)}' = {value!r}: infinite or undefined numbers "
                                   f"are not accepted")
        else:
            raise AdvisorError(f"{origin}: key '{_where(path)}' holds a {type(value).__name__} "
                               f"({prefix(value)}); only mappings, lists, strings, numbers, true/false and "
                               f"null are accepted (quote dates)")


def _check_string(text: str, path: tuple, origin: str, limit: int, what: str) -> None:
    if len(text) > limit:
        raise AdvisorError(f"{origin}: key '{_where(path)}' has a {what} of {len(text):,} characters, more "
                           f"than {limit:,} ({prefix(text)})")
    bad = _CONTROL.search(text)
    if bad:
        raise AdvisorError(f"{origin}: key '{_where(path)}' has a {what} with the control character "
                           f"U+{ord(bad.group()):04X} at position {bad.start()} ({prefix(text)}); "
                           f"write it on one line without control characters")


def load_tree(path: Path, kind: str = "file", fmt: str | None = None) -> Any:
    """Read, parse (by suffix: .json is JSON, anything else YAML) and check one input file."""
    fmt = fmt or ("json" if path.suffix == ".json" else "yaml")
    text = read_text(path, kind, limits.MAX_JSON_BYTES if fmt == "json" else limits.MAX_YAML_BYTES)
    data = parse(text, str(path), fmt)
    check_tree(data, str(path))
    return data
