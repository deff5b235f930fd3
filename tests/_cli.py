"""Test helper: run the `advisor` command line in this process (its one error handler included), as
a user's shell would see it: the exit code, and what went to stdout and stderr."""

from __future__ import annotations

import sys

import pytest


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    from advisor import cli

    monkeypatch.setattr(sys, "argv", ["advisor", *args])
    with pytest.raises(SystemExit) as done:
        cli.main()
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def cli_exit_code(monkeypatch, *args) -> int:
    """The exit code alone (the output goes where pytest puts it)."""
    from advisor import cli

    monkeypatch.setattr(sys, "argv", ["advisor", *args])
    try:
        cli.main()
    except SystemExit as done:
        return done.code or 0
    return 0
