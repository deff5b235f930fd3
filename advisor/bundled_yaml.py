"""YAML files shipped with advisor (recipes, measured runs, fit shapes): read with libyaml's C loader
where PyYAML has it (about 10x faster than the pure-Python one; 0.24 s of every `recommend` went to
recipes.yaml), else the pure-Python safe loader. Both construct the same safe types. What a user
writes goes through advisor.specs.untrusted instead (bounded nesting, strict numbers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path) -> Any:
    """The file's contents as plain Python values."""
    return yaml.load(path.read_text(), Loader=_LOADER)
