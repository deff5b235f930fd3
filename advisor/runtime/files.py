"""Files written atomically: a temporary file in the target's folder, renamed over the target.

A failed write (full disk, a file-size limit, a read-only folder) leaves the previous file as it
was, removes the temporary file and raises AdvisorError (exit 2) with one sentence. rename(2) within
one file system replaces the target atomically (POSIX, https://pubs.opengroup.org/onlinepubs/9699919799/functions/rename.html),
so a reader sees either the old file or the new one, never a part.

Only a regular file (or a new path) is replaced so: a device, a FIFO or a socket given as the target
(/dev/stdout, /dev/null, a named pipe another program reads) is written through, never replaced by a
file; a symbolic link is followed, so the file it names is replaced and the link stays; ``-`` is
standard output.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from advisor.errors import AdvisorError


def json_text(obj: Any, indent: int | None = 1) -> str:
    """JSON with no Infinity or NaN (they are not JSON, RFC 8259 section 6): a non-finite number
    raises AdvisorError naming the problem instead of writing a file other tools cannot read."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    except ValueError as exc:
        raise AdvisorError(f"the result holds a non-finite number and cannot be written as JSON ({exc})") from None


def write_atomic(path: str | Path, data: str | bytes | Callable[[IO[bytes]], None], what: str = "the file") -> Path:
    """Write ``data`` (text, bytes, or a function writing to a binary file object) to ``path``."""
    if str(path) == "-":
        return _write_through(None, data, what)
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()           # the link stays; the file it names is replaced
    if path.exists() and not path.is_file():
        return _write_through(path, data, what)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AdvisorError(f"cannot write {what} to {path}: folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise AdvisorError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    try:
        # mkstemp creates the file readable by its owner only: keep the target's mode, or the umask's
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            _write_data(fh, data)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        kept = f"{path} is left as it was" if path.exists() else "nothing was written"
        raise AdvisorError(f"cannot write {what} to {path}: {exc.strerror or exc}; {kept}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_writable(path: str | Path | None, what: str, flag: str = "--out", inputs: dict[str, Any] | None = None) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder, a missing or read-only folder,
    a read-only file, or one of the command's own input files (``inputs``: flag -> the path given; names of
    bundled files are not paths and pass). ``-``, a device or a FIFO are written through and pass."""
    if path is None or str(path) == "-":
        return
    refuse_inputs(path, what, flag, inputs or {})
    p = Path(path)
    if p.is_symlink():
        p = p.resolve()
    if p.is_dir():
        raise AdvisorError(f"{flag} {path}: it is a folder; give a file name for {what}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise AdvisorError(f"{flag} {path}: the file is not writable; nothing was run")
        return
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise AdvisorError(f"{flag} {path}: folder {folder} does not exist; nothing was run")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AdvisorError(f"{flag} {path}: folder {folder} is not writable; nothing was run")


def refuse_inputs(path: str | Path, what: str, flag: str, inputs: dict[str, Any]) -> None:
    """Refuse an output that is one of the command's input files (``inputs``: flag -> the path given; names of
    bundled files are not paths and pass)."""
    p = Path(path)
    for given_flag, given in inputs.items():
        if given and Path(str(given)).is_file() and p.is_file() and os.path.samefile(p, Path(str(given))):
            raise AdvisorError(f"{flag} {path} is the file {given_flag} reads; write {what} elsewhere")


def _write_data(fh: IO[bytes], data: str | bytes | Callable[[IO[bytes]], None]) -> None:
    """Text, bytes, or what a function writes, into a binary file object, flushed."""
    if callable(data):
        data(fh)
    else:
        fh.write(data.encode() if isinstance(data, str) else data)
    fh.flush()


def _write_through(path: Path | None, data, what: str) -> Path:
    """Write into what is there (a device, a FIFO; None: standard output) instead of replacing it."""
    where = "standard output" if path is None else str(path)
    try:
        if path is None:
            fh = sys.stdout.buffer
            sys.stdout.flush()
        else:
            if path.is_dir():
                raise AdvisorError(f"cannot write {what} to {path}: it is a folder")
            fh = path.open("wb")
        try:
            _write_data(fh, data)
        finally:
            if path is not None:
                fh.close()
    except OSError as exc:
        raise AdvisorError(f"cannot write {what} to {where}: {exc.strerror or exc}") from None
    return Path("-") if path is None else path


def write_json(path: str | Path, obj: Any, what: str = "the file", indent: int | None = 1) -> Path:
    return write_atomic(path, json_text(obj, indent), what)


def _umask() -> int:
    """The process umask, read without changing it (Linux 4.7+ shows it in /proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextmanager
def temporary_folder(prefix: str, keep: str | None = None) -> Iterator[Path]:
    """A fresh folder removed when the block ends, however it ends (success, error, or a signal
    turned into an exception by advisor.runtime.signals); ``keep``: use this folder instead and
    leave it (created when missing)."""
    if keep is not None:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
