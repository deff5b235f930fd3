"""`advisor list models | hardware`: the bundled descriptions as rich tables, with size and source."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.render.formatting import count
from advisor.specs.hardware import bundled_hardware, load_hardware
from advisor.specs.model import bundled_models, load_model
from advisor.specs.recommendation import RecModelSpec


def _table(title: str, columns: tuple[str, ...], right: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        wrap = name == "source"
        table.add_column(name, justify="right" if name in right else "left", no_wrap=not wrap,
                         overflow="fold", min_width=30 if wrap else None)
    return table


def _source(text: str, limit: int = 160) -> str:
    """The source's first reference (up to the first ';'), on one line, at most `limit` characters."""
    first = " ".join(text.split(";")[0].split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


def models_table() -> Table:
    table = _table("bundled models (models/)", ("name", "family", "parameters", "layers", "source"),
                   ("parameters", "layers"))
    for name in bundled_models():
        m = load_model(name)
        size = count(m.num_params)
        supernet = getattr(m, "family", None) == "supernet"
        if m.num_active_params != m.num_params:      # MoE: the parameters one token passes through
            size += f" ({count(m.num_active_params)} {'per subnet' if supernet else 'active'})"
        family = ("recommendation" if isinstance(m, RecModelSpec) else "supernet" if supernet
                  else "moe" if m.moe is not None else "transformer")
        table.add_row(*map(Text, (name, family, size, str(m.num_layers), _source(m.source))))
    return table


def hardware_table() -> Table:
    table = _table("bundled hardware profiles (hardware_profiles/)",
                   ("name", "device", "devices/node", "memory GiB", "source"), ("devices/node", "memory GiB"))
    for name in bundled_hardware():
        hw = load_hardware(name)
        table.add_row(*map(Text, (name, hw.device.name, str(hw.node.devices_per_node), f"{hw.device.memory_gib:g}",
                                  _source(hw.source))))
    return table


def render_list(console: Console, what: str) -> None:
    console.print(models_table() if what == "models" else hardware_table())
