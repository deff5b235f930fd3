"""Ctrl-C and termination for every command: one line on stderr and the shell's exit code.

``main()`` runs every command inside ``handled()``: SIGINT, SIGTERM and SIGHUP (the terminal or the ssh session
that ran the command closed) raise ``Interrupted`` (a
BaseException, so no ``except Exception`` swallows it) wherever the main thread is; every
``finally`` on the way out runs, which is how launched ranks are stopped and temporary folders
removed. A second signal while that cleanup runs is ignored rather than cutting the cleanup short
(a rank left behind would still exit on its own: its watchdog sees the launcher gone,
advisor.runtime.rank).

Python drops an exception raised where it cannot propagate (a finalizer, an at-fork hook such as
logging's, run by every fork) and reports it through ``sys.unraisablehook``; an Interrupted lost
that way is raised again a moment later (SIGALRM), in ordinary code. Forks that must not see the
signal before they set their own handlers run inside ``deferred()``.

Exit codes follow the shell's 128 + signal number convention (bash manual, "Exit Status":
https://www.gnu.org/software/bash/manual/html_node/Exit-Status.html): 130 for SIGINT, 143 for SIGTERM, 129 for
SIGHUP.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class Interrupted(BaseException):
    """A signal asked the command to stop."""

    def __init__(self, signum: int):
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


_received: list[int] = []
_dropped: list[int] = []
RETRY_S = 0.01      # a dropped Interrupted is raised again this much later (SIGALRM)


def _handler(signum, frame) -> None:
    if _received:                 # already stopping: let the cleanup finish
        return
    _received.append(signum)
    raise Interrupted(signum)


def _hook(info) -> None:
    """sys.unraisablehook: an Interrupted that Python had to drop is raised again a moment later,
    from a SIGALRM, in whatever the main thread runs then (no signal is handled in here)."""
    if isinstance(info.exc_value, Interrupted):
        _dropped[:] = [info.exc_value.signum]
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        return
    _previous_hook[0](info)


def _again(signum, frame) -> None:
    if _dropped:
        raise Interrupted(_dropped.pop())


_previous_hook = [sys.unraisablehook]


@contextmanager
def handled() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``; the previous handlers come back
    after it (a command run inside another program, e.g. a test, leaves its handlers alone). Off
    the main thread, where Python cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _dropped.clear()
    previous = {sig: signal.signal(sig, _handler) for sig in NAMES}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _again)
    _previous_hook[0] = sys.unraisablehook
    sys.unraisablehook = _hook
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = _previous_hook[0]
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back in this thread (and in what it forks or starts) during the
    block; a signal that came meanwhile is delivered when it ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(NAMES))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def ignore_in_child() -> None:
    """For worker processes of a pool (multiprocessing initializer, forked inside ``deferred()``):
    leave Ctrl-C to the parent, which stops the pool, and let the pool's SIGTERM end a worker
    quietly; a forked worker would otherwise run the parent's handlers and print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(NAMES))
