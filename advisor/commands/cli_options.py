"""Shared pieces of the command line (advisor.cli): the consoles and the printers of warnings and --json
output (the options' help texts live in the settings' records, advisor.specs.setting).
"""

from __future__ import annotations

import json
import sys

from rich.console import Console

from advisor.errors import AdvisorError
from advisor.runtime.terminal import OutputConsole

console = OutputConsole()
err_console = OutputConsole(stderr=True)


def wide_console(width: int = 120) -> Console:
    """The console, or one ``width`` wide where output is piped (not squeezed to 80 columns)."""
    if console.is_terminal or console.width >= width:
        return console
    return OutputConsole(file=console.file, width=width, no_color=console.no_color, highlight=False)


def print_warnings(warnings: list[str]) -> None:
    """Input warnings (advisor.specs.input_notes) on stderr, one line each."""
    for text in warnings:
        err_console.print(f"warning: {text}", markup=False, highlight=False, soft_wrap=True)


def _plain(value):
    """numpy scalars (a figure computed in numpy) as the Python numbers they hold."""
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def print_json(obj) -> None:
    """--json output: only JSON on stdout, and only JSON (no Infinity or NaN, RFC 8259)."""
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, default=_plain)
    except (ValueError, TypeError) as exc:
        raise AdvisorError(f"the result holds a non-finite number or a value that is not JSON and cannot be printed "
                           f"as JSON ({exc})") from None
    sys.stdout.write(text + "\n")


OBJECTIVE_HELP = ("throughput | time-to-target (the global batch chosen with the parallelism) | cost (the cluster "
                  "size, up to the given one, that trains a token for the least money) | carbon (tokens per kWh)")
GRID_HELP = "grid carbon intensity: gCO2e/kWh or a region (world, china, india, germany, france, norway, ...)"
PRIORITY_HELP = ("price the layers' transfers ahead of overlapped data-parallel traffic on shared links "
                 "(MindPipe-style communication priority; default: fair sharing)")
PUE_HELP = "the data centre's power usage effectiveness (default 1.58)"
TOKEN_DROP_HELP = ("MoE: drop tokens beyond capacity factor 1 and pad each expert to it (Megatron's "
                   "--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity): static shapes, no host "
                   "synchronization, whole-layer CUDA graphs; default: dropless")
TARGET_TOKENS_HELP = "time-to-target: tokens to the target at a small batch, e.g. 300B (with --critical-batch-tokens)"
TARGET_LOSS_HELP = "time-to-target: a loss in Kaplan et al. 2020's units (nats per token)"
CRITICAL_HELP = "measured critical batch (gradient noise scale) in tokens, e.g. 4M"
HOST_EMBEDDING_HELP = ("the word-embedding table, its lookup and its optimizer on the host CPU (MindSpore Host&Device "
                       "training; --framework mindspore, untied embeddings)")
