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
    """A short, safe quotation of a value for an error message (repr of at most a 40-character prefix; text with
    characters beyond ASCII is quoted with their escapes, so a look-alike, a Cyrillic 'а' in 'llаma3-8b', shows
    as what it is: 'll\\u0430ma3-8b')."""
    if isinstance(value, str):
        head = value[:_PREFIX_CHARS]
        return (repr(head) if head.isascii() else ascii(head)) + ("..." if len(value) > _PREFIX_CHARS else "")
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


# YAML 1.1 integers that YAML 1.2 (and a reader's eye) take otherwise: a leading zero is octal (040 = 32),
# colons are base 60 (1:30 = 90); both are refused rather than read as PyYAML's resolver reads them
_YAML11_INT = re.compile(r"[-+]?(0[0-7_]+|[1-9][0-9_]*(:[0-5]?[0-9])+)")
_YAML11_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*")


class _Strict:
    """Safe construction as a user means it: a key given twice in one mapping is refused (the last one would
    win silently), and so are YAML 1.1's octal and base-60 numbers."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = key_node.value
                if key in seen:
                    raise AdvisorError(f"key {prefix(key)} is given twice in one mapping (line "
                                       f"{key_node.start_mark.line + 1}); keep one")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        text = str(node.value)
        if _YAML11_INT.fullmatch(text):
            raise AdvisorError(f"{prefix(text)} (line {node.start_mark.line + 1}) is a YAML 1.1 octal or base-60 "
                               "number, which it would read as another value: write it without the leading zero "
                               "or the colons, or quote it as text")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        if _YAML11_FLOAT.fullmatch(str(node.value)):
            raise AdvisorError(f"{prefix(str(node.value))} (line {node.start_mark.line + 1}) is a YAML 1.1 base-60 "
                               "number: write it as a decimal, or quote it as text")
        return super().construct_yaml_float(node)


def _strict(cls):
    """The loader class with _Strict's number constructors registered (mappings reach its construct_mapping
    through SafeConstructor.construct_yaml_map)."""
    cls.add_constructor("tag:yaml.org,2002:int", _Strict.construct_yaml_int)
    cls.add_constructor("tag:yaml.org,2002:float", _Strict.construct_yaml_float)
    return cls


# the loaders, C (libyaml) and pure Python; _measure_events has bounded nesting and expansion before either runs
_CLoader = (_strict(type("_StrictCSafeLoader", (_Strict, yaml.CSafeLoader), {}))
            if getattr(yaml, "__with_libyaml__", False) else None)
_PyLoader = _strict(type("_StrictSafeLoader", (_Strict, yaml.SafeLoader), {}))

_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _measure_events(text: str, loader) -> None:
    """Refuse, from the parser's event stream (iterative) and before anything is composed, a document nested
    deeper than limits.MAX_DEPTH or one whose aliases expand it to more than limits.MAX_VALUES values: each
    anchored node's size (values with its own aliases expanded) is known when it closes, and an alias, merge
    keys (``<<: [*a, *a, ...]``) included, adds the size of what it names. A nine-line merge-key bomb that
    PyYAML would expand for minutes (nine levels of nine merges) is refused at once."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[None, 0]]          # [anchor, values so far] per open collection; the root first
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            stack[-1][1] += sizes.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            stack[-1][1] += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, _OPEN):
            if len(stack) > limits.MAX_DEPTH:
                raise AdvisorError(f"nesting deeper than {limits.MAX_DEPTH} levels (line {event.start_mark.line + 1})")
            stack.append([event.anchor, 1])
        elif isinstance(event, _CLOSE):
            anchor, size = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            stack[-1][1] += size
        else:
            continue
        if stack[-1][1] > limits.MAX_VALUES or (len(stack) > 1 and stack[-1][1] + stack[0][1] > limits.MAX_VALUES):
            mark = event.start_mark
            raise AdvisorError(f"its aliases expand it to more than {limits.MAX_VALUES:,} values (line {mark.line + 1}): "
                               "an alias or merge-key bomb?")


def _parse_yaml(text: str) -> Any:
    """PyYAML's safe loading, after _measure_events has bounded the nesting (the composer recurses once per level,
    libyaml's in C) and the aliases' expansion (PyYAML expands merge keys while constructing, before any later
    check could count). With libyaml the C parser and loader are used (about 3x faster)."""
    with_c = _CLoader is not None and getattr(yaml, "__with_libyaml__", False)
    _measure_events(text, yaml.CSafeLoader if with_c else yaml.SafeLoader)
    return yaml.load(text, Loader=_CLoader if with_c else _PyLoader)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {prefix(key)} is given twice in one object; keep one")
        data[key] = value
    return data


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
            return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                              object_pairs_hook=_no_duplicate_keys)
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


def check_tree(data: Any, origin: str, fmt: str = "yaml") -> None:
    """Walk a parsed document once (iteratively) and refuse what no advisor input may hold."""
    stack: list[tuple[Any, tuple, int]] = [(data, (), 0)]
    seen = 0
    while stack:
        value, path, depth = stack.pop()
        seen += 1
        if seen > limits.MAX_VALUES:
            how = "" if fmt == "json" else " once YAML aliases are expanded (an alias bomb?)"
            raise AdvisorError(f"{origin}: more than {limits.MAX_VALUES:,} values{how}, more than advisor reads; near "
                               f"key '{_where(path)}'")
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
    check_tree(data, str(path), fmt)
    return data
