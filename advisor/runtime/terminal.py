"""The rich consoles the command line prints with.

rich's Console ends the process with exit 1 when standard output is a closed pipe
(Console.on_broken_pipe: ``advisor list models | head -1``); here the closed pipe is raised as the
BrokenPipeError it is, so that advisor.cli ends the command the one way it ends every closed pipe:
quietly, with the shell's 128 + SIGPIPE.
"""

from __future__ import annotations

import errno

from rich.console import Console


class OutputConsole(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True             # nothing more is written to the closed pipe
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")
