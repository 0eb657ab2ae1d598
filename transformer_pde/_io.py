"""Atomic file output (the bottom floor): every file is written to a temporary file in the same
directory and renamed into place, so a process killed at any instant leaves each file either
absent, old, or complete. :func:`lock_directory` gives one process at a time a directory."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): directories are not locked
    fcntl = None

import numpy as np

_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK
"""Mode of output files (mkstemp makes 0600; outputs are ordinary files)."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename: never half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def result_array(key, value) -> np.ndarray:
    """A named result as a numeric array; names must be non-empty strings and values numeric
    (an object array would need pickling to save)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"result names must be non-empty strings, got {key!r}")
    arr = np.asarray(value)
    if arr.dtype == object:
        raise ValueError(f"result {key!r} is not a numeric array (dtype object): compute must return "
                         f"arrays")
    return arr


def npz_bytes(arrays: dict) -> bytes:
    """An ``.npz`` archive (readable by ``np.load``) whose bytes depend only on the arrays.

    ``np.savez`` stamps each member with the current time; here every member gets the same
    fixed timestamp, so identical arrays give identical files.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            arr = result_array(key, value)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    return buf.getvalue()


def save_npz(path: Path, arrays: dict) -> None:
    atomic_write_bytes(path, npz_bytes(arrays))


def save_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def save_gif(anim, path: Path, fps: int) -> Path:
    """Write a matplotlib animation as a GIF (Pillow), atomically: temp file, then rename."""
    from matplotlib.animation import PillowWriter

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".gif")
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    try:
        anim.save(tmp, writer=PillowWriter(fps=fps))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ----------------------------------------------------------------------------- directory lock

LOCK_FILE = ".lock"
"""The lock file of an output directory (kept: removing it would let two processes lock two
different files of the same name)."""


class DirectoryBusyError(RuntimeError):
    """Another process holds the lock of a directory.

    Attributes:
        directory: the directory.
        holder: what the holder wrote into the lock file (``pid``, ``host``, ``started``,
            ``command``), or None when it could not be read (it is still writing it).
    """

    def __init__(self, directory, holder: dict | None):
        self.directory = Path(directory)
        self.holder = holder
        super().__init__(f"{str(self.directory)!r} is in use by another run ({describe_holder(holder)}); "
                         f"wait for it to end, or choose another directory")


def describe_holder(holder: dict | None) -> str:
    """``pid 1234 on host, since 2025-01-01T12:00:00, `transformer-pde run clustering ...```."""
    if not isinstance(holder, dict):
        return "pid unknown"
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("host") and holder.get("host") != socket.gethostname():
        parts[0] += f" on {holder['host']}"
    if holder.get("started"):
        parts.append(f"since {holder['started']}")
    command = holder.get("command")
    if isinstance(command, list) and command:
        name = Path(str(command[0])).name
        text = " ".join(["transformer-pde" if name in ("cli.py", "transformer-pde") else name]
                        + [str(c) for c in command[1:]])
        parts.append(f"`{text[:200]}`")
    return ", ".join(parts)


def _read_holder(fd: int) -> dict | None:
    try:
        holder = json.loads(os.pread(fd, 65536, 0).decode())
    except (OSError, ValueError):  # empty or partly written: the holder is writing it now
        return None
    return holder if isinstance(holder, dict) else None


def _is_running(holder: dict | None) -> bool:
    """The record names a process that is alive (on another host: assumed)."""
    if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _read_current_holder(fd: int, patience: float = 1.0) -> dict | None:
    """The lock holder's record. The holder writes it just after taking the lock, so until then
    the file is empty or still holds the previous (ended) holder's record: read again for up to
    ``patience`` seconds; None if no live holder's record appeared (never a stale one)."""
    deadline = time.monotonic() + patience
    while True:
        holder = _read_holder(fd)
        if _is_running(holder):
            return holder
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


@contextlib.contextmanager
def lock_directory(directory):
    """Hold an exclusive lock on ``directory`` (which must exist) for the ``with`` block.

    The lock is ``fcntl.flock`` on ``directory/.lock``, held through an open file for the
    whole block; the file records the holder (pid, host, start time, command) for the error
    of whoever finds it taken, and is removed when the block ends. The kernel releases the lock when its process ends, however
    it ends (SIGKILL included), so a lock left by a dead process is free for the next one: no
    stale-lock cleanup is needed. Never waits: a taken lock raises :class:`DirectoryBusyError`
    at once. Locks are per open file, so a second ``lock_directory`` of the same directory in
    the same process is refused too.

    Raises:
        DirectoryBusyError: another process (or another open of this one) holds the lock.
        OSError: the lock file cannot be created (a read-only directory, ...).
    """
    directory = Path(directory)
    path = directory / LOCK_FILE
    if fcntl is None:  # pragma: no cover
        yield
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            holder = _read_current_holder(fd)
            os.close(fd)
            raise DirectoryBusyError(directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        # the file may have been removed or replaced between open and flock: lock the one there
        try:
            st, now = os.fstat(fd), os.stat(path)
            same = (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": list(sys.argv)}
        data = json.dumps(record).encode()
        os.pwrite(fd, data, 0)  # then cut a longer previous record's tail: never an empty file
        os.ftruncate(fd, len(data))
        yield
    finally:
        # remove the file while still holding the lock (a run leaves no .lock behind); a process
        # that opened it meanwhile finds it unlinked after its flock and retries on a new file
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # releases the lock
