"""`advisor list models | hardware`: the bundled descriptions as rich tables, with size and source."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from advisor.render.formatting import count
from advisor.specs.hardware import bundled_hardware, load_hardware
from advisor.specs.model import bundled_models, load_model
from advisor.families import family_of_model


# Below this width the source column would be a few characters wide: the sources follow the table instead
SOURCE_COLUMN_WIDTH = 110


def _table(title: str, columns: tuple[str, ...], right: tuple[str, ...], sources: bool = True) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns if sources else columns[:-1]:
        wrap = name == "source"
        table.add_column(name, justify="right" if name in right else "left", no_wrap=not wrap,
                         overflow="fold", min_width=30 if wrap else None)
    return table


def _source(text: str, limit: int = 160) -> str:
    """The source's first reference (up to the first ';'), on one line, at most `limit` characters."""
    first = " ".join(text.split(";")[0].split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


def model_rows() -> list[dict]:
    """One row per bundled model: name, family (moe for a transformer with experts), parameters, active
    parameters, layers, source."""
    rows = []
    for name in bundled_models():
        m = load_model(name)
        family = family_of_model(m).name
        if family == "transformer" and m.moe is not None:
            family = "moe"
        rows.append({"name": name, "family": family, "parameters": m.num_params,
                     "active_parameters": m.num_active_params, "layers": m.num_layers, "source": m.source})
    return rows


def hardware_rows() -> list[dict]:
    """One row per bundled hardware profile: name, device, devices per node, memory, source."""
    rows = []
    for name in bundled_hardware():
        hw = load_hardware(name)
        rows.append({"name": name, "device": hw.device.name, "devices_per_node": hw.node.devices_per_node,
                     "memory_gib": hw.device.memory_gib, "source": hw.source})
    return rows


def models_table(sources: bool = True) -> Table:
    table = _table("bundled models (models/)", ("name", "family", "parameters", "layers", "source"),
                   ("parameters", "layers"), sources)
    for r in model_rows():
        size = count(r["parameters"])
        if r["active_parameters"] != r["parameters"]:      # MoE: the parameters one token passes through
            size += f" ({count(r['active_parameters'])} {'per subnet' if r['family'] == 'supernet' else 'active'})"
        cells = (r["name"], r["family"], size, str(r["layers"])) + ((_source(r["source"]),) if sources else ())
        table.add_row(*map(Text, cells))
    return table


def hardware_table(sources: bool = True) -> Table:
    table = _table("bundled hardware profiles (hardware_profiles/)",
                   ("name", "device", "devices/node", "memory GiB", "source"), ("devices/node", "memory GiB"), sources)
    for r in hardware_rows():
        cells = (r["name"], r["device"], str(r["devices_per_node"]), f"{r['memory_gib']:g}") + (
            (_source(r["source"]),) if sources else ())
        table.add_row(*map(Text, cells))
    return table


def render_list(console: Console, what: str) -> None:
    """The table; on a console narrower than SOURCE_COLUMN_WIDTH without its source column, each source then
    following as 'name: source', wrapped to the width."""
    wide = console.width >= SOURCE_COLUMN_WIDTH
    console.print(models_table(wide) if what == "models" else hardware_table(wide))
    if not wide:
        console.print("sources:", markup=False, highlight=False)
        for r in model_rows() if what == "models" else hardware_rows():
            console.print(Text(f"  {r['name']}: {_source(r['source'], limit=1000)}"))
