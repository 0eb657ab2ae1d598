"""Atomic file output (the bottom floor): every file is written to a temporary file in the same
directory and renamed into place, so a process killed at any instant leaves each file either
absent, old, or complete."""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

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


def npz_bytes(arrays: dict) -> bytes:
    """An ``.npz`` archive (readable by ``np.load``) whose bytes depend only on the arrays.

    ``np.savez`` stamps each member with the current time; here every member gets the same
    fixed timestamp, so identical arrays give identical files.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"result names must be non-empty strings, got {key!r}")
            arr = np.asarray(value)
            if arr.dtype == object:
                raise ValueError(f"result {key!r} is not a numeric array (dtype object): "
                                 f"compute must return arrays")
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
