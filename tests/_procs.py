"""Test helper: the processes still running whose command line names a marker (a run's own folder),
to check that a launch left no rank, server or worker behind."""

from __future__ import annotations

from pathlib import Path


def processes_naming(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
