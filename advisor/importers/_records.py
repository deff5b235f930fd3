"""Config keys read back into settings through the settings' own records (advisor.specs.setting:
``Setting.frameworks`` spells each value a target runs as "path.to.key = value"), the reverse of
advisor.export._settings.keys: a setting a record spells needs no reader of its own."""

from __future__ import annotations

from typing import Any

from advisor.export._settings import literal
from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.setting import settings_of


def spelled_paths(target: str) -> set[str]:
    """Every config path some setting's record spells for ``target``."""
    out = set()
    for cls in (TrainingJob, Strategy):
        for _, s in settings_of(cls):
            for text in (s.frameworks or {}).get(target, {}).values():
                if "=" in text:
                    out.add(text.partition("=")[0].strip())
    return out


def read_spelled(target: str, flat: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """(TrainingJob settings, Strategy settings, the paths read) for the config keys ``flat`` ("a.b" -> value)
    that a setting's record spells for ``target``; a spelled path whose value no record names is left unread,
    for the caller to refuse."""
    job: dict[str, Any] = {}
    strategy: dict[str, Any] = {}
    read: set[str] = set()
    for cls, out in ((TrainingJob, job), (Strategy, strategy)):
        for fl, s in settings_of(cls):
            for key, text in (s.frameworks or {}).get(target, {}).items():
                path, eq, raw = text.partition("=")
                path = path.strip()
                if not eq or path not in flat or flat[path] != literal(raw.strip()):
                    continue
                value = key.split("@")[0]
                out[fl.name] = (value == "true") if s.kind == "boolean" else value
                read.add(path)
    return job, strategy, read
