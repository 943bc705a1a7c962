"""Files a node writes once: created whole or not at all, never overwritten (leaf vocabulary of the package)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def write_once(file: Path, data: bytes) -> None:
    """Create ``file`` with ``data`` (mode 0600) unless it exists; the parent folder must exist.

    Written aside, then linked into place: concurrent creators agree on the first one's content, and no reader sees
    half a file.
    """
    if file.exists():
        return
    aside = file.with_name(f".{file.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(aside, file)
    except FileExistsError:  # another creator made it first: its content is the content
        pass
    finally:
        aside.unlink()
