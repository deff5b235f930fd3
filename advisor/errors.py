"""The project's own error types. The CLI catches AdvisorError once and exits with its message."""


class AdvisorError(Exception):
    """Bad input from the user (a file, a key, a value, a flag). CLI exit code 2."""

    exit_code = 2


class InfeasibleError(AdvisorError):
    """A well-formed request that cannot be satisfied (nothing fits). CLI exit code 1."""

    exit_code = 1
