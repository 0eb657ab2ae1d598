"""A run directory: its files, the status of the run it holds, and the rules for reusing it.

Layout::

    metadata.json   status ("running" | "interrupted" | "failed" | "complete"), experiment, config, seed,
                    provenance (versions, JAX backend and devices, git commit, command), timings
                    (and the error of a failed run), the outputs of a complete one
    config.json     the resolved options (JSON)
    config.toml     the same, loadable with ``--config`` to rerun
    checkpoints/    chunk files of a resumable run in progress (removed once complete), and
                    ``run.json``: the experiment, options and chunk length that wrote them
    data.npz        the arrays of the run's :class:`~.result.Result` (once complete)
    results.nc      its labelled grids (netCDF-4; layout in :mod:`.result`), where it has some
    *.png           figures (``transformer-pde plot DIR`` redraws them from the saved result)
    .lock           the lock file (:func:`transformer_pde._io.lock_directory`)

Every file is written to a temporary file in the same directory and renamed into place, so
a run killed at any instant (SIGKILL included) leaves each file either absent, or old, or
complete.

The status is a small state machine: a run writes "running" before it computes, then
"complete", or "failed" / "interrupted" when it stops; a process killed outright leaves
"running". Two runs never mix in one directory: an unfinished run is continued, from its last
good checkpoint, only by a run of the same experiment, options and chunk length
(:func:`run_difference` names what differs); the same run again over a complete one computes
nothing (it says so), and a run that replaces a complete one (``--replace``) first removes that
run's files (:func:`clear_run`). A run writes only into an empty directory or one holding
a run (:func:`check_empty_or_run`), and removes only files a run writes: its fixed files, the
figures and grids its metadata lists, its checkpoint files and their temporaries; anything else
in the directory stays. Nothing here imports JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from pathlib import Path

from .._io import LOCK_FILE, lock_directory
from .checkpoint import DEFAULT_EVERY, Checkpoint
from .layout import (
    CHECKPOINT_DIR,
    CORRUPT_FILE_ERRORS,
    DATA_FILE,
    GRIDS_FILE,
    METADATA_FILE,
    OWN_FILES,
    RUN_IDENTITY_FILE,
    STATUS_COMPLETE,
    STATUS_FAILED,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    STATUSES,
    error_text,
    read_metadata,
)
from .runnable import RunnableExperiment


def note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


# ----------------------------------------------------------------------------- reading


def require_run(run_dir: Path) -> dict:
    """The metadata of the run in ``run_dir``; ValueError naming why there is none."""
    meta = read_metadata(run_dir)
    if meta is None:
        why = "" if Path(run_dir).exists() else "; the directory does not exist"
        raise ValueError(f"{str(run_dir)!r} holds no run ({METADATA_FILE} is missing{why})")
    return meta


# ----------------------------------------------------------------------------- identity


def identity(exp: RunnableExperiment, config, every: int | None) -> dict:
    """What determines a run's outputs: experiment, resolved options, chunk length."""
    return {"experiment": exp.name, "config": dataclasses.asdict(config),
            "checkpoint_every": every if exp.resumable else None}


def run_difference(exp: RunnableExperiment, saved: dict, config, every: int | None) -> str:
    """How the run recorded in ``saved`` (metadata or ``run.json``) differs from ``config``
    with chunk length ``every``: ``"beta=1.0 there, 2.0 here; ..."``, or ``""`` if it is the
    same run."""
    if saved.get("experiment") != exp.name:
        return f"it is a run of {saved.get('experiment')!r}, not {exp.name!r}"
    try:
        old = exp.config_from_mapping(saved.get("config", {}), source="its saved options")
    except ValueError as e:
        return f"its saved options are invalid ({e})"
    diffs = [f"{name}={there} there, {here} here"
             for name, (there, here) in exp.changed_options(old, config).items()]
    saved_every = saved.get("checkpoint_every")
    if exp.resumable and saved_every is not None and every is not None and saved_every != every:
        diffs.append(f"checkpoint_every={saved_every} there, {every} here")
    return "; ".join(diffs)


# ----------------------------------------------------------------------------- changing it


def make_directory(out_dir: Path) -> None:
    """Create ``out_dir`` (and its parents); ValueError naming why it cannot be."""
    if str(out_dir).strip() == "":
        raise ValueError("the output directory must be named (got an empty path)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output path {str(out_dir)!r} exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output directory {str(out_dir)!r} "
                         f"({e.strerror or error_text(e)})") from None


@contextlib.contextmanager
def locked(out_dir: Path):
    """Hold the directory's lock for the block: DirectoryBusyError when another run holds it,
    ValueError when the lock file cannot be made."""
    try:
        lock = lock_directory(out_dir)
        lock.__enter__()
    except OSError as e:
        raise ValueError(f"cannot write in the output directory {str(out_dir)!r} "
                         f"({e.strerror or error_text(e)})") from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _temporaries(directory: Path, name: str) -> list[Path]:
    """The temporary files an atomic write of ``directory/name`` leaves when killed
    (``_io.atomic_write_bytes``: ``.NAME.XXXXXXXX.tmp``; a GIF: ``.STEM.XXXXXXXX.gif``)."""
    p = Path(name)
    found = list(directory.glob(f".{glob_escape(p.name)}.*.tmp"))
    if p.suffix == ".gif":
        found += directory.glob(f".{glob_escape(p.stem)}.*.gif")
    return [f for f in found if f.is_file() and not f.is_symlink()]


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def check_empty_or_run(out_dir: Path, previous: dict | None) -> None:
    """A run writes into a directory that holds a run of ours, or into an empty one: anything
    else there belongs to someone else, and a run never removes what it did not write."""
    if previous is not None:
        return
    ours = {LOCK_FILE, *(p.name for p in _temporaries(out_dir, METADATA_FILE))}
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in ours)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(f"the output directory (--out) {str(out_dir)!r} is not empty and holds no run "
                         f"({METADATA_FILE} is missing; it holds {shown}); a run writes only into an "
                         f"empty directory or one of its own runs: choose another --out")


def remove_stale_temporaries(out_dir: Path, previous: dict | None) -> None:
    """Temporary files left by a SIGKILL during a write (renames never happened): only those
    named after a file the run writes (its fixed files, the figures ``previous`` lists, its
    checkpoint files); another ``.*.tmp`` is not ours and stays."""
    figures = (previous or {}).get("figures")
    names = [*OWN_FILES, *(Path(str(f)).name for f in (figures if isinstance(figures, list) else []))]
    for name in names:
        if name not in ("", ".", ".."):
            for tmp in _temporaries(out_dir, name):
                tmp.unlink(missing_ok=True)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    if previous is None or ckpt_dir.is_symlink() or not ckpt_dir.is_dir():
        return
    for tmp in _temporaries(ckpt_dir, RUN_IDENTITY_FILE):
        tmp.unlink(missing_ok=True)
    for stage in ckpt_dir.iterdir():
        if stage.is_dir() and not stage.is_symlink():
            for tmp in [*_temporaries(stage, "manifest.json"), *stage.glob(".chunk_*.tmp")]:
                if tmp.is_file() and (tmp.name.startswith(".manifest") or _CHUNK_TMP.fullmatch(tmp.name)):
                    tmp.unlink(missing_ok=True)


def remove_checkpoints(ckpt_dir: Path) -> None:
    """Remove the files a run's checkpoints are made of (``run.json``, each stage's
    ``manifest.json`` and ``chunk_NNNNNN.npz``, their temporaries), then the directories they
    leave empty; anything else in ``checkpoints/`` is not ours and stays (with its directory)."""
    if ckpt_dir.is_symlink() or not ckpt_dir.is_dir():
        return
    for stage in ckpt_dir.iterdir():
        if stage.is_dir() and not stage.is_symlink():
            _remove_stage(stage)
    _remove_files(ckpt_dir, [RUN_IDENTITY_FILE])
    with contextlib.suppress(OSError):  # not empty: it holds someone else's files
        ckpt_dir.rmdir()


def _remove_stage(stage_dir: Path) -> None:
    """The files of one checkpoint stage (manifest, chunks, their temporaries), then the stage
    directory if that leaves it empty."""
    chunks = [p.name for p in stage_dir.glob("chunk_*.npz") if _CHUNK.fullmatch(p.name)]
    _remove_files(stage_dir, ["manifest.json", *chunks])
    for tmp in stage_dir.glob(".chunk_*.tmp"):
        if _CHUNK_TMP.fullmatch(tmp.name) and tmp.is_file():
            tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        stage_dir.rmdir()


def _remove_files(directory: Path, names) -> None:
    for name in names:
        for f in [directory / name, *_temporaries(directory, name)]:
            if f.is_file() and not f.is_symlink():
                f.unlink(missing_ok=True)


_CHUNK = re.compile(r"chunk_\d{6}\.npz")
_CHUNK_TMP = re.compile(r"\.chunk_\d{6}\.npz\.[^.]+\.tmp")


def clear_run(out_dir: Path, previous: dict | None) -> None:
    """Remove the outputs of the complete run ``previous`` (metadata first: the directory then
    holds no run): its data file, the grids and figures its metadata lists, its checkpoints;
    nothing it did not write."""
    if previous is None:
        return
    (out_dir / METADATA_FILE).unlink(missing_ok=True)
    listed = [DATA_FILE]
    if previous.get("grids") or previous.get("grid_names"):
        listed.append(GRIDS_FILE)
    figures = previous.get("figures")
    listed += [Path(str(f)).name for f in (figures if isinstance(figures, list) else [])]
    for name in listed:
        p = out_dir / name
        if name not in ("", ".", "..", METADATA_FILE) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
    remove_checkpoints(out_dir / CHECKPOINT_DIR)


def check_checkpoints(ckpt_dir: Path, exp: RunnableExperiment, config, every: int | None) -> None:
    """Before continuing a run: its checkpoints must be its own (``run.json``), and each stage
    is cut back to its last chunk that reads back whole (a damaged chunk is recomputed)."""
    if not ckpt_dir.is_dir():
        return
    ident = ckpt_dir / RUN_IDENTITY_FILE
    if ident.exists():
        try:
            saved = json.loads(ident.read_text())
            if not isinstance(saved, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            note(f"{ident} is unreadable ({error_text(e)}); recomputing from the start")
            remove_checkpoints(ckpt_dir)
            return
        diff = run_difference(exp, saved, config, every)
        if diff:
            raise ValueError(f"the checkpoints in {str(ckpt_dir)!r} were written by another run "
                             f"({diff}); a run continues only from its own checkpoints")
    reader = Checkpoint(ckpt_dir, every or DEFAULT_EVERY)
    for stage in reader.stages():
        try:
            man = reader.manifest(stage)
            if man is None:
                continue
            completed = man.get("completed") if isinstance(man, dict) else None
            if isinstance(completed, bool) or not isinstance(completed, int) or completed < 0:
                raise ValueError(f"completed = {completed!r}")
        except ValueError as e:
            note(f"checkpoint stage {ckpt_dir / stage} is unreadable ({error_text(e)}); recomputing it")
            _remove_stage(ckpt_dir / stage)
            continue
        good = 0
        for j in range(completed):
            try:
                chunk = reader.read_chunk(stage, j, man.get("run"))
                if "state" not in chunk or "num_steps" not in chunk:
                    raise KeyError("state/num_steps")
            except CORRUPT_FILE_ERRORS as e:
                note(f"checkpoint {stage} chunk {j} is unreadable ({error_text(e)}); continuing from chunk {j}")
                break
            good += 1
        if good < completed:
            reader.set_completed(stage, man, good)


__all__ = ["CHECKPOINT_DIR", "CORRUPT_FILE_ERRORS", "METADATA_FILE", "RUN_IDENTITY_FILE", "STATUSES",
           "STATUS_COMPLETE", "STATUS_FAILED", "STATUS_INTERRUPTED", "STATUS_RUNNING", "check_checkpoints",
           "check_empty_or_run", "clear_run", "error_text", "identity", "locked", "make_directory", "note", "read_metadata",
           "remove_checkpoints", "remove_stale_temporaries", "require_run", "run_difference"]
