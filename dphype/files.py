"""Files a node keeps: created whole or not at all, appended and synced, locked (leaf vocabulary of the package)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(lock_file: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``lock_file`` (created with mode 0600, its folder 0700).

    Args:
        lock_file: The lock's file.
        timeout: Seconds to wait for another process to release it.

    Yields:
        Nothing; the lock is held meanwhile.

    Raises:
        OSError: The file cannot be opened.
        TimeoutError: Another process held the lock for ``timeout`` seconds.
    """  # noqa: DOC503
    lock_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{lock_file} is locked by another process") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def append_synced(file: Path, line: str) -> None:
    """Append ``line`` to ``file`` (created with mode 0600, its folder 0700) and sync it, and the folder on creation.

    Args:
        file: The file.
        line: What to append (its newline included).

    Raises:
        OSError: The file cannot be written.
    """  # noqa: DOC502
    created = not file.exists()
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        folder = os.open(file.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


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
