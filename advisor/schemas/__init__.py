"""JSON Schemas (Draft 2020-12) of advisor's JSON: the plan file and every ``--json`` output.

Each schema is a file next to this module, ``<name>.schema.json``, whose ``$id`` is
``https://advisor.invalid/schemas/<name>.schema.json``; schemas reference one another by that
``$id`` (the ``recommend`` schema's plans are ``plan`` schemas). ``plan.schema.json`` is generated
from the settings' records (``python -m advisor.schemas.generate``); the others are written by hand.

    >>> from advisor.schemas import validate
    >>> validate(json.loads(text), "estimate")     # AdvisorError naming the first mismatch

jsonschema is imported by ``validate`` only: importing advisor never needs it.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from advisor.errors import AdvisorError

BASE_URI = "https://advisor.invalid/schemas/"
SUFFIX = ".schema.json"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_MESSAGE_CHARS = 200


def schema_id(name: str) -> str:
    """The ``$id`` of the schema ``name``."""
    return f"{BASE_URI}{name}{SUFFIX}"


def schema_names() -> tuple[str, ...]:
    """The names of the schemas shipped with advisor, sorted."""
    return tuple(sorted(p.name[: -len(SUFFIX)] for p in resources.files(__name__).iterdir()
                        if p.name.endswith(SUFFIX)))


def load_schema(name: str) -> dict:
    """The schema ``name`` (``plan``, ``recommend``, ``estimate``, ...) as a fresh mapping."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise AdvisorError(f"no JSON schema named {str(name)[:40]!r} (known: {', '.join(schema_names())})")
    path = resources.files(__name__).joinpath(name + SUFFIX)
    if not path.is_file():
        raise AdvisorError(f"no JSON schema named {name!r} (known: {', '.join(schema_names())})")
    return json.loads(path.read_text(encoding="utf-8"))


def _json_path(parts) -> str:
    """An error's location as a JSONPath ($.parallel.dp, $.plans[0].training)."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(p)):
            out += f".{p}"
        else:
            out += f"[{json.dumps(str(p))}]"
    return out


def _short(message: str) -> str:
    """jsonschema's message on one line, cut to a readable length (it quotes whole instances)."""
    text = " ".join(str(message).split()).rstrip(".")
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _validator(name: str):
    """A Draft 2020-12 validator of the schema ``name`` that resolves the other shipped schemas by ``$id``."""
    import jsonschema

    schemas = {n: load_schema(n) for n in schema_names()}
    schema = schemas[name] if name in schemas else load_schema(name)
    cls = jsonschema.Draft202012Validator
    try:
        from referencing import Registry, Resource           # jsonschema >= 4.18
        from referencing.jsonschema import DRAFT202012
    except ImportError:                                        # older jsonschema 4: its RefResolver
        store = {s.get("$id", schema_id(n)): s for n, s in schemas.items()}
        resolver = jsonschema.RefResolver.from_schema(schema, store=store)
        return cls(schema, resolver=resolver)
    registry = Registry().with_resources(
        (s.get("$id", schema_id(n)), Resource.from_contents(s, default_specification=DRAFT202012))
        for n, s in schemas.items())
    return cls(schema, registry=registry)


def validate(instance: Any, name: str) -> None:
    """Check ``instance`` (parsed JSON) against the schema ``name``; an AdvisorError names the first
    mismatch's JSON path and says what is wrong there."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        raise AdvisorError("validating JSON against advisor's schemas needs the jsonschema package "
                           "(pip install 'jsonschema>=4')") from None
    from jsonschema.exceptions import best_match

    error = best_match(_validator(name).iter_errors(instance))
    if error is not None:
        raise AdvisorError(f"{name}{SUFFIX}: at {_json_path(error.absolute_path)}: {_short(error.message)}")
