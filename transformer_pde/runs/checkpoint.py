"""The files of a resumable solve: :class:`Checkpoint`, a directory of chunks, one stage each.

A stage (one ``solve_checkpointed`` call of a run) is a sub-directory holding
``chunk_000000.npz, chunk_000001.npz, ...`` (each chunk's saved outputs, end state and step
count, and the run's identity and the chunk's index, so a chunk of another run or copied over
another is refused) and ``manifest.json``, which records the run's identity and how many chunks are
complete. A chunk is written before the manifest that declares it, each atomically
(temporary file + rename), so a process killed at any instant leaves a stage whose declared
chunks are all whole. Nothing here integrates (:mod:`.chunked` does); reading a stage needs
only NumPy, so the run directory can check one without importing JAX.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._io import save_json, save_npz

DEFAULT_EVERY = 10
"""Default chunk length, in save intervals (the CLI's ``--checkpoint-every``)."""


def check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"checkpoint every must be an integer >= 1 (save intervals per chunk), "
                         f"got {every!r}")
    return int(every)


def _make_dir(directory, what: str = "checkpoint directory") -> Path:
    """``directory`` (a non-empty path) made with its parents; ValueError naming the file in the
    way where the path or one of its parents is a file (mkdir's bare FileExistsError or
    NotADirectoryError named neither)."""
    import os

    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ValueError(f"{what} must be a non-empty path, got {directory!r}")
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ValueError(f"{what} {path}: {blocker} is a file, not a directory (move it, or choose "
                         f"another directory)") from None
    return path


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"checkpoint stage name must be a non-empty string of letters, digits, "
                         f"'-' and '_', got {name!r}")
    return name


class Checkpoint:
    """A directory of checkpoints, one sub-directory per named stage of a run.

    Args:
        directory: where checkpoints live (created if needed).
        every: chunk length in save intervals; a checkpoint is written after each chunk.
        name: the stage :func:`~transformer_pde.runs.solve_checkpointed` writes to;
            :meth:`stage` gives the same directory with another stage (one per solve of a
            multi-solve run).
        safe_point: called after each chunk is on disk, before the next one starts. The runner
            passes its signal check (:func:`~transformer_pde.runs.signals.check_interrupt`),
            so a signal whose exception was swallowed still stops the run at a chunk boundary.

    Resumable experiments receive one from the runner and pass ``checkpoint.stage(...)`` to
    :func:`~transformer_pde.runs.solve_checkpointed` (see ``experiments/clustering.py``).
    """

    def __init__(self, directory, every: int = DEFAULT_EVERY, name: str = "solve",
                 safe_point: Callable[[], None] | None = None):
        self.every = check_every(every)
        self.name = _check_name(name)
        if safe_point is not None and not callable(safe_point):
            raise ValueError(f"safe_point must be a callable or None, got {safe_point!r}")
        self.safe_point = safe_point
        self.directory = _make_dir(directory)

    def __repr__(self):
        return f"Checkpoint({str(self.directory)!r}, every={self.every}, name={self.name!r})"

    def stage(self, name: str) -> Checkpoint:
        """This checkpoint directory, writing to stage ``name``."""
        return Checkpoint(self.directory, self.every, name, self.safe_point)

    def stage_dir(self, name: str) -> Path:
        return self.directory / _check_name(name)

    def stages(self) -> list[str]:
        """The stages present in the directory, sorted."""
        return sorted(p.name for p in self.directory.iterdir() if p.is_dir())

    def manifest(self, name: str) -> dict | None:
        """The stage's manifest (``{"completed": k, ...}``), or None if it never checkpointed."""
        path = self.stage_dir(name) / "manifest.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:  # atomic writes make this unreachable
            raise ValueError(f"checkpoint manifest {path} is unreadable: {e}") from e

    def set_completed(self, name: str, manifest: dict, completed: int) -> None:
        """Declare only the first ``completed`` chunks of the stage (the rest are recomputed)."""
        save_json(self.stage_dir(name) / "manifest.json", {**manifest, "completed": completed})

    def write_chunk(self, name: str, index: int, arrays: dict, manifest: dict) -> None:
        """Write chunk ``index`` then the manifest that declares it complete (in that order).
        The chunk carries ``manifest["run"]`` (the run's fingerprint) and its index."""
        d = _make_dir(self.stage_dir(name), "checkpoint stage directory")
        identity = {_RUN: np.asarray(str(manifest.get("run", ""))), _INDEX: np.asarray(index, np.int64)}
        save_npz(d / f"chunk_{index:06d}.npz", {**arrays, **identity})
        self.set_completed(name, manifest, index + 1)

    def read_chunk(self, name: str, index: int, run: str | None = None) -> dict:
        """Chunk ``index`` of stage ``name``, checked to be whole, to be chunk ``index`` and (when
        ``run`` is given) to belong to the run of that fingerprint: ValueError naming the file
        otherwise."""
        path = self.stage_dir(name) / f"chunk_{index:06d}.npz"
        fresh = "; delete the stage directory (or use a fresh output directory) to recompute it"
        try:
            with np.load(path, allow_pickle=False) as f:
                data = {k: f[k] for k in f.files}
        except FileNotFoundError:
            raise ValueError(f"checkpoint chunk {path} is missing although the manifest declares it"
                             f"{fresh}") from None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
            raise ValueError(f"checkpoint chunk {path} is damaged (not a readable .npz: "
                             f"{type(e).__name__}){fresh}") from e
        if _INDEX not in data or _RUN not in data:
            raise ValueError(f"checkpoint chunk {path} carries no run identity (written by an older "
                             f"version, or not a chunk){fresh}")
        if data[_INDEX].shape != () or int(data[_INDEX]) != index:
            raise ValueError(f"checkpoint chunk {path} is chunk {data[_INDEX]} of its run, not chunk "
                             f"{index} (a file copied over another){fresh}")
        if run is not None and str(data[_RUN]) != run:
            raise ValueError(f"checkpoint chunk {path} belongs to another run (fingerprint "
                             f"{str(data[_RUN])[:12]}..., this run {run[:12]}...){fresh}")
        del data[_INDEX], data[_RUN]
        return data


_RUN, _INDEX = "_run", "_index"  # the identity every chunk carries


__all__ = ["DEFAULT_EVERY", "Checkpoint"]
