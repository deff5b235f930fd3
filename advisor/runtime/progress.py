"""Progress bars on stderr (rich) for long commands: shown only when stderr is a terminal and the
command is not printing JSON, and removed when the work ends (transient).

``bar(enabled, label)`` is a context manager yielding ``update(done, total, label=None)``.
``ranks_progress(update, nproc)`` turns it into the launcher's poll hook (advisor.runtime.launch):
ranks joined so far while they start, then what rank 0 reports in out/progress.json
(advisor.runtime.rank.report_progress).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

Update = Callable[..., None]


def enabled(as_json: bool = False) -> bool:
    try:
        return sys.stderr.isatty() and not as_json
    except (AttributeError, ValueError):
        return False


@contextmanager
def bar(show: bool, label: str) -> Iterator[Update]:
    if not show:
        yield lambda *args, **kwargs: None
        return
    from advisor.runtime.terminal import OutputConsole
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=OutputConsole(stderr=True), transient=True)
    task = progress.add_task(label, total=None)

    def update(done: float, total: float | None, label: str | None = None) -> None:
        fields = {"description": label} if label else {}
        progress.update(task, completed=done, total=total, **fields)

    progress.start()
    try:
        yield update
    finally:
        progress.stop()


def ranks_progress(update: Update, nproc: int) -> Callable[[Path, list], None]:
    """The launcher's hook: (out folder, exit codes so far) -> the bar."""
    def hook(out: Path, codes: list) -> None:
        ready = sum(1 for r in range(nproc) if (out / f"rank{r}.ready").exists())
        if ready < nproc:
            update(ready, nproc, "starting ranks")
            return
        try:
            state = json.loads((out / "progress.json").read_text())
            update(state["done"], state["total"], state["label"])
        except (OSError, ValueError, KeyError, TypeError):
            update(0, None, "running")
    return hook
