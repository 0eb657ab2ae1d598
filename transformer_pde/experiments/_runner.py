"""Run an experiment into a directory: data, metadata and figures, written atomically.

Layout of an output directory::

    metadata.json   status ("running" | "interrupted" | "failed" | "complete"), experiment, config, seed,
                    package versions, JAX backend and devices, git commit, timings (and the error
                    of a failed run)
    config.json     the resolved options (JSON)
    config.toml     the same, loadable with ``--config`` to rerun
    checkpoints/    chunk files of a resumable run in progress (removed once complete), and
                    ``run.json``: the experiment, options and chunk length that wrote them
    data.npz        the arrays of the :class:`~._result.Result` of ``compute`` (once complete)
    results.nc      its labelled grids (netCDF-4, one group each), for experiments that have them
    *.png           figures (``transformer-pde plot DIR`` redraws them from the saved result)
    .lock           the lock file (see below)

Every file is written to a temporary file in the same directory and renamed into place, so
a run killed at any instant (SIGKILL included) leaves each file either absent, or old, or
complete. ``data.npz`` is written deterministically (fixed zip timestamps), so the same
command and seed give byte-identical data files.

One run at a time: a run holds an exclusive lock on its directory from before it reads
``metadata.json`` until it returns (:func:`transformer_pde._io.lock_directory`; the kernel
releases it when the process dies), and a second run there fails at once naming the holder.

Two runs never mix in one directory. An unfinished run ("running" after a kill,
"interrupted", "failed") is continued, from its last good checkpoint, only by a run of the
same experiment, options and chunk length (``resume=True``, or the same command again);
another run there is refused with the options that differ. A run started over a complete
one first removes that run's metadata, data, grids, figures and checkpoints.

Signals (see :func:`stop_on_signals`): SIGINT and SIGTERM interrupt the run at once where
Python can raise, and are also recorded, so one whose exception was swallowed (a signal that
lands in a garbage-collection callback) still stops the run at the next safe point the
runner controls: after each checkpoint, after ``compute``, before the data and the figures.
The final metadata write is not interrupted: a signal there leaves a complete run, and
:func:`pending_signal` tells the caller it came.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import shutil
import signal
import subprocess
import sys
import time
import zipfile
import zlib
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np

# npz_bytes and DirectoryBusyError are re-exported
from .._io import DirectoryBusyError, atomic_write_bytes, lock_directory, npz_bytes, save_json  # noqa: F401
from ..solvers.checkpoint import DEFAULT_EVERY, Checkpoint
from ._base import Experiment, config_to_toml, get
from ._options import format_value
from ._result import DATA_FILE, GRIDS_FILE, Result

_PACKAGES = ("transformer_pde", "jax", "jaxlib", "equinox", "diffrax", "ott-jax", "optax",
             "numpy", "matplotlib", "xarray", "h5netcdf")

STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_FAILED, STATUS_COMPLETE = (
    "running", "interrupted", "failed", "complete")
_STATUSES = (STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_FAILED, STATUS_COMPLETE)

METADATA_FILE = "metadata.json"
CHECKPOINT_DIR = "checkpoints"
RUN_IDENTITY_FILE = "run.json"

#: What reading a damaged ``.npz`` / ``.nc`` / JSON file raises (truncated, bit-flipped,
#: replaced by another file): a BadZipFile, a zlib error, an EOFError, numpy's ValueErrors
#: ("pickled data", a bad header), OSError, a missing member (KeyError).
CORRUPT_FILE_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


# ----------------------------------------------------------------------------- signals


class RunInterrupted(BaseException):
    """Raised (from a signal handler, or at a safe point) to stop a run cleanly; ``signum`` is
    the signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


class _SignalState:
    pending: list = []  # signals received since stop_on_signals began
    deferred: bool = False  # inside the final writes: record only


def _on_signal(signum, frame):
    _SignalState.pending.append(signum)
    if not _SignalState.deferred:
        # Raised here where Python can (a prompt stop); if code that runs the handler swallows
        # it (a gc callback, a __del__), the recorded signal stops the run at the next safe point.
        raise RunInterrupted(signum)


def pending_signal() -> int | None:
    """The first SIGINT/SIGTERM received in the current :func:`stop_on_signals` block, or None
    (ask inside the block: leaving it forgets them)."""
    return _SignalState.pending[0] if _SignalState.pending else None


def check_interrupt() -> None:
    """A safe point: raise :class:`RunInterrupted` if a signal came, even one whose exception
    was swallowed where it landed."""
    if _SignalState.pending and not _SignalState.deferred:
        raise RunInterrupted(_SignalState.pending[0])


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """While the block runs, SIGINT and SIGTERM stop a run (:class:`RunInterrupted`) instead of
    killing the process; the previous handlers come back after it. Outside the main thread
    (where handlers cannot be set) the block runs without them."""
    _SignalState.pending = []
    _SignalState.deferred = False
    previous = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not in the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _SignalState.pending = []  # a later run outside this block must not see them


@contextlib.contextmanager
def _signals_deferred():
    """Signals are recorded, not raised, in this block (the writes that complete a run)."""
    before = _SignalState.deferred
    _SignalState.deferred = True
    try:
        yield
    finally:
        _SignalState.deferred = before


class _SafePointCheckpoint(Checkpoint):
    """The runner's checkpoint: after each chunk is on disk, a recorded signal stops the run."""

    def stage(self, name: str) -> "_SafePointCheckpoint":
        return _SafePointCheckpoint(self.directory, self.every, name)

    def write_chunk(self, name, index, arrays, manifest) -> None:
        super().write_chunk(name, index, arrays, manifest)
        check_interrupt()


# ----------------------------------------------------------------------------- environment

def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git_commit() -> str | None:
    """The commit of the checkout that holds this package (None outside a git checkout)."""
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        if res.returncode != 0 or not res.stdout.strip():
            return None
        commit = res.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    import jax

    return {
        "versions": _versions(),
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kinds": sorted({d.device_kind for d in jax.devices()}),
        "x64": bool(jax.config.jax_enable_x64),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "command": sys.argv,
    }


# ----------------------------------------------------------------------------- reading a run


def read_metadata(out_dir: Path) -> dict | None:
    """The ``metadata.json`` of ``out_dir`` (None when there is none).

    Raises ValueError when ``out_dir`` is not a directory, or the file is unreadable or is not
    the metadata of a run (a JSON object naming its experiment, options and status)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} is not a directory")
    path = out_dir / METADATA_FILE
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is unreadable ({_error_text(e)}); not an output directory of "
                         "transformer-pde, or a damaged one") from None
    problem = None
    if not isinstance(meta, dict):
        problem = f"a JSON object was expected, found {type(meta).__name__}"
    elif not isinstance(meta.get("experiment"), str):
        problem = f"it names no experiment (experiment = {meta.get('experiment')!r})"
    elif meta.get("status") not in _STATUSES:
        problem = f"unknown status {meta.get('status')!r} (one of {', '.join(_STATUSES)})"
    elif not isinstance(meta.get("config", {}), dict):
        problem = f"its config is not a table of options ({type(meta['config']).__name__})"
    if problem:
        raise ValueError(f"{path} is not the metadata of a run: {problem}")
    return meta


def _error_text(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, ValueError) and "pickle" in text:  # numpy's advice to unpickle: never here
        text = "not an archive of arrays: NumPy reads it as pickled data, which is never loaded"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _remove_stale_temporaries(out_dir: Path) -> None:
    """Temporary files left by a SIGKILL during a write (renames never happened)."""
    for tmp in list(out_dir.glob(".*.tmp")) + list(out_dir.glob(f"{CHECKPOINT_DIR}/*/.*.tmp")):
        tmp.unlink(missing_ok=True)


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


# ----------------------------------------------------------------------------- run identity


def _identity(exp: Experiment, config, every: int | None) -> dict:
    """What determines a run's outputs: experiment, resolved options, chunk length."""
    return {"experiment": exp.name, "config": dataclasses.asdict(config),
            "checkpoint_every": every if exp.resumable else None}


def run_difference(exp: Experiment, saved: dict, config, every: int | None) -> str:
    """How the run recorded in ``saved`` (metadata or ``run.json``) differs from ``config``
    with chunk length ``every``: ``"beta=1.0 there, 2.0 here; ..."``, or ``""`` if it is the
    same run."""
    if saved.get("experiment") != exp.name:
        return f"it is a run of {saved.get('experiment')!r}, not {exp.name!r}"
    try:
        old = exp.config_from_mapping(saved.get("config", {}), source="its saved options")
    except ValueError as e:
        return f"its saved options are invalid ({e})"
    diffs = [f"{f.name}={format_value(getattr(old, f.name))} there, "
             f"{format_value(getattr(config, f.name))} here"
             for f in dataclasses.fields(config) if getattr(old, f.name) != getattr(config, f.name)]
    saved_every = saved.get("checkpoint_every")
    if exp.resumable and saved_every is not None and every is not None and saved_every != every:
        diffs.append(f"checkpoint_every={saved_every} there, {every} here")
    return "; ".join(diffs)


def _check_checkpoints(ckpt_dir: Path, exp: Experiment, config, every: int | None) -> None:
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
            _note(f"{ident} is unreadable ({_error_text(e)}); recomputing from the start")
            shutil.rmtree(ckpt_dir)
            return
        diff = run_difference(exp, saved, config, every)
        if diff:
            raise ValueError(f"the checkpoints in {str(ckpt_dir)!r} were written by another run "
                             f"({diff}); a run continues only from its own checkpoints")
    reader = Checkpoint(ckpt_dir, every or DEFAULT_EVERY)
    for stage in sorted(p for p in ckpt_dir.iterdir() if p.is_dir()):
        try:
            man = reader.manifest(stage.name)
            if man is None:
                continue
            completed = man.get("completed") if isinstance(man, dict) else None
            if isinstance(completed, bool) or not isinstance(completed, int) or completed < 0:
                raise ValueError(f"completed = {completed!r}")
        except ValueError as e:
            _note(f"checkpoint stage {stage} is unreadable ({_error_text(e)}); recomputing it")
            shutil.rmtree(stage)
            continue
        good = 0
        for j in range(completed):
            try:
                chunk = reader.read_chunk(stage.name, j)
                if "state" not in chunk or "num_steps" not in chunk:
                    raise KeyError("state/num_steps")
            except CORRUPT_FILE_ERRORS as e:
                _note(f"checkpoint {stage.name} chunk {j} is unreadable ({_error_text(e)}); "
                      f"continuing from chunk {j}")
                break
            good += 1
        if good < completed:
            save_json(stage / "manifest.json", {**man, "completed": good})


def _clear_run(out_dir: Path, previous: dict | None) -> None:
    """Remove what a previous run left (metadata first: the directory then holds no run)."""
    (out_dir / METADATA_FILE).unlink(missing_ok=True)
    for name in (DATA_FILE, GRIDS_FILE):
        (out_dir / name).unlink(missing_ok=True)
    figures = (previous or {}).get("figures")
    for f in figures if isinstance(figures, list) else []:
        p = out_dir / Path(str(f)).name
        if p.name not in ("", ".", "..", METADATA_FILE) and p.is_file():
            p.unlink(missing_ok=True)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    if ckpt_dir.is_dir():
        shutil.rmtree(ckpt_dir)
    elif ckpt_dir.exists():
        ckpt_dir.unlink()


def _make_directory(out_dir: Path) -> None:
    if str(out_dir).strip() == "":
        raise ValueError("the output directory must be named (got an empty path)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output path {str(out_dir)!r} exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output directory {str(out_dir)!r} "
                         f"({e.strerror or _error_text(e)})") from None


@contextlib.contextmanager
def _locked(out_dir: Path):
    try:
        lock = lock_directory(out_dir)
        lock.__enter__()
    except OSError as e:
        raise ValueError(f"cannot write in the output directory {str(out_dir)!r} "
                         f"({e.strerror or _error_text(e)})") from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


# ----------------------------------------------------------------------------- running


def run_experiment(exp: Experiment, config, out_dir: Path, *, progress: bool = True,
                   checkpoint_every: int | None = None, resume: bool = False) -> dict:
    """Compute, save ``data.npz``, ``config.json``, ``config.toml``, ``metadata.json``, figures.

    Args:
        exp, config: the experiment and its resolved options.
        out_dir: output directory (created).
        progress: show progress bars.
        checkpoint_every: for resumable experiments, chunk length in save intervals
            (default :data:`transformer_pde.checkpoint.DEFAULT_EVERY`; a continued run keeps
            its own).
        resume: continue the run in ``out_dir`` (its options must equal ``config``; see the
            CLI's ``--resume``), from its last good checkpoint.

    The directory is locked for the whole call (:class:`DirectoryBusyError` if another run
    holds it). An unfinished run there (killed, interrupted or failed) is continued when
    ``config`` and the chunk length are its own, and refused otherwise (ValueError naming the
    options that differ); a complete run there is replaced. Returns ``{"data", "metadata",
    "figures", "results", "grids", "continued"}`` (``results``: the
    :class:`~._result.Result`; ``grids``: the ``results.nc`` path or None; ``continued``:
    whether an unfinished run was continued).

    An exception raised once the run has started (after ``metadata.json`` says "running")
    marks the run "failed" (with the error), or "interrupted" for :class:`RunInterrupted` and
    KeyboardInterrupt, is given the attribute ``failed_run`` (this directory), and propagates.
    """
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
            checkpoint_every, int) or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    out_dir = Path(out_dir)
    _make_directory(out_dir)
    with _locked(out_dir):
        return _run_locked(exp, config, out_dir, progress, checkpoint_every, resume)


def _run_locked(exp, config, out_dir, progress, checkpoint_every, resume) -> dict:
    _remove_stale_temporaries(out_dir)
    previous = read_metadata(out_dir)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    status = None if previous is None else previous.get("status")
    every = (checkpoint_every or DEFAULT_EVERY) if exp.resumable else None
    if resume:
        if previous is None:
            raise ValueError(f"nothing to resume in {str(out_dir)!r}: no {METADATA_FILE}")
        saved_every = previous.get("checkpoint_every")
        if exp.resumable and isinstance(saved_every, int) and checkpoint_every is None:
            every = saved_every  # a resumed run keeps its chunk length
        diff = run_difference(exp, previous, config, every)
        if diff:
            raise ValueError(f"cannot resume the run in {str(out_dir)!r} with other options "
                             f"({diff}); a run resumes only with its own")
        continued = True
    elif previous is not None and status != STATUS_COMPLETE:
        diff = run_difference(exp, previous, config, every)
        if diff:
            state = "killed while running" if status == STATUS_RUNNING else status
            raise ValueError(f"{str(out_dir)!r} holds an unfinished run ({state}) with other "
                             f"options ({diff}); continue it with --resume {out_dir}, write this "
                             f"run elsewhere (--out), or remove the directory")
        continued = True
        _note(f"{out_dir} holds an unfinished run of these options ({status}); continuing it")
    else:
        continued = False
    if continued:
        _check_checkpoints(ckpt_dir, exp, config, every)
    else:
        _clear_run(out_dir, previous)

    cfg = dataclasses.asdict(config)
    checkpoint = None
    if exp.resumable:
        checkpoint = _SafePointCheckpoint(ckpt_dir, every)
        if not (ckpt_dir / RUN_IDENTITY_FILE).exists():
            save_json(ckpt_dir / RUN_IDENTITY_FILE, _identity(exp, config, every))
    save_json(out_dir / "config.json", cfg)
    atomic_write_bytes(out_dir / "config.toml", config_to_toml(exp, config).encode())
    meta = {
        "experiment": exp.name,
        "summary": exp.summary,
        "config": cfg,
        "seed": cfg.get("seed"),
        "resumable": exp.resumable,
        "checkpoint_every": every,
        "created": previous.get("created") if continued else time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "resumed": (int(previous.get("resumed") or 0) + 1) if continued else 0,
        **environment(),
    }
    meta_path = out_dir / METADATA_FILE
    save_json(meta_path, {**meta, "status": STATUS_RUNNING})

    start = time.perf_counter()
    data_path = out_dir / DATA_FILE
    try:
        check_interrupt()
        if exp.resumable:
            results = exp.compute(config, progress, checkpoint=checkpoint)
        else:
            results = exp.compute(config, progress)
        wall = time.perf_counter() - start
        check_interrupt()
        if not isinstance(results, Result):
            raise ValueError(f"experiment '{exp.name}': compute must return a Result, got "
                             f"{type(results).__name__}")
        written = results.save(out_dir)
        check_interrupt()
        figures = [str(p) for p in exp.figures(results, config, out_dir)]
        check_interrupt()
    except (KeyboardInterrupt, RunInterrupted) as e:
        _mark(e, meta_path, {**meta, "status": STATUS_INTERRUPTED,
                             "wall_time_s": time.perf_counter() - start})
        raise
    except BaseException as e:
        _mark(e, meta_path, {**meta, "status": STATUS_FAILED, "error": _error_text(e),
                             "wall_time_s": time.perf_counter() - start})
        raise
    meta.update({"status": STATUS_COMPLETE, "wall_time_s": wall, "figures": figures,
                 "data": str(data_path), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    if out_dir / GRIDS_FILE in written:
        meta["grids"] = str(out_dir / GRIDS_FILE)
    with _signals_deferred():  # the run is done: a signal now must not leave it half-marked
        save_json(meta_path, meta)
        if ckpt_dir.exists():
            shutil.rmtree(ckpt_dir)  # the data file now holds everything the checkpoints did
    return {"data": data_path, "metadata": meta_path, "figures": figures, "results": results,
            "grids": meta.get("grids"), "continued": continued}


def _mark(error: BaseException, meta_path: Path, meta: dict) -> None:
    """Record how a started run ended (best effort: the disk may be what failed)."""
    try:
        error.failed_run = meta_path.parent
    except AttributeError:  # pragma: no cover - exceptions without a __dict__
        pass
    with _signals_deferred():
        try:
            save_json(meta_path, meta)
        except OSError:
            pass


# ----------------------------------------------------------------------------- plot


def load_run(run_dir: Path):
    """``(experiment, config, result)`` of the complete run saved in ``run_dir``.

    Raises ValueError naming the problem for anything that is not a readable complete run:
    no such directory, no or damaged metadata, an unfinished run, a damaged or missing
    ``data.npz`` / ``results.nc``."""
    run_dir = Path(run_dir)
    meta = read_metadata(run_dir)
    if meta is None:
        why = "" if run_dir.exists() else "; the directory does not exist"
        raise ValueError(f"{str(run_dir)!r} holds no run ({METADATA_FILE} is missing{why})")
    if meta.get("status") != STATUS_COMPLETE:
        raise ValueError(f"the run in {str(run_dir)!r} is not complete (status "
                         f"{meta.get('status')!r}); finish it with --resume {run_dir}")
    exp = get(meta.get("experiment"))
    config = exp.config_from_mapping(meta.get("config", {}), source=f"{run_dir}/{METADATA_FILE}")
    data = run_dir / DATA_FILE
    if not data.is_file():
        raise ValueError(f"{str(run_dir)!r} holds no {DATA_FILE}, though its metadata says the run "
                         f"is complete; run it again")
    try:
        result = Result.load(run_dir)
    except CORRUPT_FILE_ERRORS as e:
        culprit = GRIDS_FILE if _npz_readable(data) else DATA_FILE
        raise ValueError(f"{run_dir / culprit} is unreadable ({_error_text(e)}); the run's saved "
                         f"result is damaged: run it again") from None
    return exp, config, result


def _npz_readable(path: Path) -> bool:
    try:
        with np.load(path, allow_pickle=False) as f:
            for k in f.files:
                f[k]
        return True
    except CORRUPT_FILE_ERRORS:
        return False


def redraw(run_dir: Path, out_dir: Path | None = None) -> list[str]:
    """Draw the figures of the complete run in ``run_dir`` again, from its saved result (no
    recomputation), into ``out_dir`` (default: ``run_dir``, locked while drawing). Returns
    the figure paths."""
    run_dir = Path(run_dir)
    out_dir = Path(run_dir if out_dir is None else out_dir)
    in_place = out_dir == run_dir and run_dir.is_dir()
    with _locked(run_dir) if in_place else contextlib.nullcontext():
        exp, config, result = load_run(run_dir)
        if not in_place:
            _make_directory(out_dir)
        try:
            return [str(p) for p in exp.figures(result, config, out_dir)]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"cannot draw the figures of {str(run_dir)!r} from its saved "
                             f"{DATA_FILE} ({_error_text(e)}): it does not match the run's "
                             f"{METADATA_FILE}") from None
