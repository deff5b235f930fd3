"""Files written atomically: a temporary file in the target's folder, renamed over the target.

A failed write (full disk, a file-size limit, a read-only folder) leaves the previous file as it
was, removes the temporary file and raises AdvisorError (exit 2) with one sentence. rename(2) within
one file system replaces the target atomically (POSIX, https://pubs.opengroup.org/onlinepubs/9699919799/functions/rename.html),
so a reader sees either the old file or the new one, never a part.
"""

from __future__ import annotations

import json
import os
import shutil
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
    path = Path(path)
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
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
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
