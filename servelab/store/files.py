"""Writing a file the user named (`report -o`, `compare --report`, `export --to`): whole or not at all, and a
path that cannot be written is one line naming it and why, exit 2, not a traceback.

The text goes to `<path>.tmp` first and is renamed over `path`, so a reader never sees half a file and a failed
write leaves no `.tmp` behind.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from servelab.errors import UserError
from servelab.store.db import os_error_words


def _hint(exc: OSError) -> str:
    if isinstance(exc, IsADirectoryError):
        return "give a file's path, not a directory's"
    if exc.errno == errno.ENOSPC:
        return "free some space, or write it elsewhere"
    return "choose a directory you can write to"


@contextlib.contextmanager
def output_file(path: Path, what: str) -> Iterator[Path]:
    """Yields the temporary path to write `path`'s content to; renames it over `path` when the block ends.
    An OSError (a missing or read-only directory, a full disk, a path that is a directory) becomes a UserError
    naming `what` and `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    blocking = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:  # mkdir would say only "File exists"
        raise UserError(f"cannot write the {what} {path}: {blocking} is a file, not a directory",
                        hint="choose another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UserError(f"cannot write the {what} {path}: {os_error_words(exc)}", hint=_hint(exc)) from None


def write_output(path: Path, text: str, what: str) -> Path:
    with output_file(path, what) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def ensure_output_dir(path: Path, what: str) -> Path:
    """Create the directory `path` (and its parents), or a UserError saying why it cannot be."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the {what} {path}: {os_error_words(exc)}", hint=_hint(exc)) from None
    return Path(path)
