"""Run an experiment into a directory, or redraw a finished run's figures from its saved result.

:func:`run_experiment` drives the state machine of :mod:`.directory`: it locks the directory,
continues or refuses an unfinished run there (or clears a complete one), records the run as
"running" with its provenance, computes (resumable experiments get a
:class:`~.checkpoint.Checkpoint` whose safe point is the signal check), writes the result and
the figures, and marks the run "complete". A started run that stops marks its directory and
says so by type: :class:`FailedRun` (status "failed", the cause chained) or
:class:`InterruptedRun` (status "interrupted"). ``data.npz`` is written deterministically, so
the same command and seed give byte-identical data files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

import numpy as np

from .._io import atomic_write_bytes, save_json
from . import directory as rundir
from .checkpoint import DEFAULT_EVERY, Checkpoint
from .directory import (
    CHECKPOINT_DIR,
    METADATA_FILE,
    RUN_IDENTITY_FILE,
    STATUS_COMPLETE,
    STATUS_FAILED,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
)
from .programs import kept_programs
from .provenance import environment
from .result import DATA_FILE, GRIDS_FILE, Result
from .runnable import RunnableExperiment
from .signals import SignalReceived, check_interrupt, on_forced_stop, signals_deferred


class FailedRun(Exception):
    """A started run raised: its directory is marked "failed" (with the error), and
    ``transformer-pde run --resume`` retries it from its last good checkpoint.

    Attributes:
        run_dir: the run's directory.
        cause: the exception that ended it (also ``__cause__``).
    """

    def __init__(self, run_dir: Path, cause: BaseException):
        super().__init__(str(cause))
        self.run_dir = Path(run_dir)
        self.cause = cause


class InterruptedRun(BaseException):
    """A started run was stopped by SIGINT/SIGTERM (or KeyboardInterrupt): its directory is
    consistent and marked "interrupted", and ``--resume`` continues it.

    Attributes:
        run_dir: the run's directory.
        signum: the signal.
    """

    def __init__(self, run_dir: Path, signum: int):
        super().__init__(f"the run in {run_dir} was interrupted by signal {signum}")
        self.run_dir = Path(run_dir)
        self.signum = signum


def run_experiment(exp: RunnableExperiment, config, out_dir: Path, *, progress: bool = True,
                   checkpoint_every: int | None = None, resume: bool = False,
                   replace: bool = False) -> dict:
    """Compute, save ``data.npz``, ``config.json``, ``config.toml``, ``metadata.json``, figures.

    Args:
        exp, config: the experiment and its resolved options.
        out_dir: output directory (created).
        progress: show progress bars.
        checkpoint_every: for resumable experiments, chunk length in save intervals
            (default :data:`~.checkpoint.DEFAULT_EVERY`; a continued run keeps its own).
        resume: continue the run in ``out_dir`` (its options must equal ``config``; see the
            CLI's ``--resume``), from its last good checkpoint.
        replace: overwrite a complete run in ``out_dir`` (the CLI's ``--replace``); without it
            a complete run of other options is refused, naming the options that differ, and
            one of the same options is returned as it is (nothing computed; a note says so).

    The directory is locked for the whole call (:class:`~transformer_pde._io.DirectoryBusyError`
    if another run holds it). An unfinished run there (killed, interrupted or failed) is
    continued when ``config`` and the chunk length are its own, and refused otherwise
    (ValueError naming the options that differ); a complete run there is replaced with
    ``replace``, else returned as it is when it has the same options and refused likewise
    otherwise. Returns ``{"data", "metadata", "figures", "results", "grids", "continued"}``
    (``results``: the :class:`~.result.Result`; ``grids``: the ``results.nc`` path or None;
    ``continued``: whether an unfinished run was continued), plus ``"already_complete": True``
    where nothing was computed.

    Raises:
        FailedRun: the started run raised (it is marked "failed").
        InterruptedRun: a signal or KeyboardInterrupt stopped the started run (it is marked
            "interrupted").
        ValueError, DirectoryBusyError: the run could not start (nothing was changed).
    """
    if not isinstance(exp, RunnableExperiment):
        raise ValueError(f"run_experiment: exp must be an experiment (a transformer_pde.experiments.Experiment, "
                         f"such as experiments.REGISTRY['clustering']), got {type(exp).__name__} {exp!r}"[:300])
    if not isinstance(config, exp.config):
        raise ValueError(f"run_experiment: config must be the options of {exp.name!r}, a {exp.config.__name__} "
                         f"(exp.config(...)), got {type(config).__name__} {config!r}"[:300])
    if not isinstance(out_dir, (str, os.PathLike)):
        raise ValueError(f"run_experiment: out_dir must be a path, got {type(out_dir).__name__} {out_dir!r}"[:300])
    for name, flag in (("progress", progress), ("resume", resume), ("replace", replace)):
        if not isinstance(flag, bool):
            raise ValueError(f"run_experiment: {name} must be True or False, got {flag!r}"[:300])
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
            checkpoint_every, int) or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    out_dir = Path(out_dir)
    rundir.make_directory(out_dir)
    with rundir.locked(out_dir):
        return _run_locked(exp, config, out_dir, progress, checkpoint_every, resume, replace)


def _run_locked(exp, config, out_dir, progress, checkpoint_every, resume, replace) -> dict:
    previous = rundir.read_metadata(out_dir)
    rundir.check_empty_or_run(out_dir, previous)
    rundir.remove_stale_temporaries(out_dir, previous)
    ckpt_dir = out_dir / CHECKPOINT_DIR
    status = None if previous is None else previous.get("status")
    every = (checkpoint_every or DEFAULT_EVERY) if exp.resumable else None
    if resume:
        if previous is None:
            raise ValueError(f"nothing to resume in {str(out_dir)!r}: no {METADATA_FILE}")
        saved_every = previous.get("checkpoint_every")
        if exp.resumable and isinstance(saved_every, int) and checkpoint_every is None:
            every = saved_every  # a resumed run keeps its chunk length
        diff = rundir.run_difference(exp, previous, config, every)
        if diff:
            raise ValueError(f"cannot resume the run in {str(out_dir)!r} with other options "
                             f"({diff}); a run resumes only with its own")
        continued = True
    elif previous is not None and status != STATUS_COMPLETE:
        diff = rundir.run_difference(exp, previous, config, every)
        if diff:
            state = "killed while running" if status == STATUS_RUNNING else status
            raise ValueError(f"{str(out_dir)!r} holds an unfinished run ({state}) with other "
                             f"options ({diff}); continue it with --resume {out_dir}, write this "
                             f"run elsewhere (--out), or remove the directory")
        continued = True
        rundir.note(f"{out_dir} holds an unfinished run of these options ({status}); continuing it")
    else:
        diff = None if previous is None or replace else rundir.run_difference(exp, previous, config, every)
        if diff:
            raise ValueError(f"{str(out_dir)!r} holds a complete run with other options ({diff}); write "
                             f"this run elsewhere (--out), or pass --replace to overwrite it")
        if previous is not None and not replace:
            return _complete_already(out_dir, previous)
        continued = False
    if continued:
        rundir.check_checkpoints(ckpt_dir, exp, config, every)
    else:
        rundir.clear_run(out_dir, previous)

    cfg = dataclasses.asdict(config)
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
    # the metadata first: every other file the run writes is then in a directory holding a run
    save_json(meta_path, {**meta, "status": STATUS_RUNNING})

    def prepare():  # the run's other files, once it is recorded (a signal now marks it interrupted)
        checkpoint = None
        if exp.resumable:
            checkpoint = Checkpoint(ckpt_dir, every, safe_point=check_interrupt)
            if not (ckpt_dir / RUN_IDENTITY_FILE).exists():
                save_json(ckpt_dir / RUN_IDENTITY_FILE, rundir.identity(exp, config, every))
        save_json(out_dir / "config.json", cfg)
        atomic_write_bytes(out_dir / "config.toml", exp.config_toml(config).encode())
        return checkpoint

    start = time.perf_counter()
    data_path = out_dir / DATA_FILE

    def forced_stop(signum):  # the watchdog's last act (runs/signals.py): a resumable directory
        _mark(meta_path, {**meta, "status": STATUS_INTERRUPTED, "stopped_by": "watchdog",
                          "wall_time_s": time.perf_counter() - start})

    with on_forced_stop(forced_stop):
        return _compute_and_save(exp, config, out_dir, progress, prepare, meta, meta_path, start,
                                 data_path, ckpt_dir, continued)


def _complete_already(out_dir: Path, meta: dict) -> dict:
    """The same run again over a complete one: nothing is computed or written; its result is
    returned (read back and checked) and the caller told so."""
    try:
        results = Result.load(out_dir)
    except ValueError as e:
        raise ValueError(f"{str(out_dir)!r} holds a complete run of these options whose result is damaged "
                         f"({e}); pass --replace to compute it again") from None
    rundir.note(f"{out_dir} already holds a complete run of these options: nothing computed (pass "
                f"--replace to compute it again)")
    figures = meta.get("figures")
    return {"data": out_dir / DATA_FILE, "metadata": out_dir / METADATA_FILE,
            "figures": [str(f) for f in figures] if isinstance(figures, list) else [],
            "results": results, "grids": str(out_dir / GRIDS_FILE) if results.grids else None,
            "continued": False, "already_complete": True}


def _compute_and_save(exp, config, out_dir, progress, prepare, meta, meta_path, start, data_path,
                      ckpt_dir, continued) -> dict:
    try:
        checkpoint = prepare()
        check_interrupt()
        with kept_programs():  # with the compile cache on, a later run loads its solves' programs
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
    except (KeyboardInterrupt, SignalReceived) as e:
        _mark(meta_path, {**meta, "status": STATUS_INTERRUPTED, "wall_time_s": time.perf_counter() - start})
        signum = e.signum if isinstance(e, SignalReceived) else int(signal.SIGINT)
        raise InterruptedRun(out_dir, signum) from e
    except BaseException as e:
        _mark(meta_path, {**meta, "status": STATUS_FAILED, "error": rundir.error_text(e),
                          "wall_time_s": time.perf_counter() - start})
        if not isinstance(e, Exception):  # SystemExit, GeneratorExit: not a failure to report
            raise
        raise FailedRun(out_dir, e) from e
    meta.update({"status": STATUS_COMPLETE, "wall_time_s": wall, "figures": figures,
                 "data": str(data_path), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 NONFINITE_KEY: nonfinite_counts(results)})
    if out_dir / GRIDS_FILE in written:
        meta["grids"] = str(out_dir / GRIDS_FILE)
        meta["grid_names"] = list(results.grids)
    with signals_deferred():  # the run is done: a signal now must not leave it half-marked
        # the data file now holds everything the checkpoints did; they are removed before the
        # status, which is the run's last write (a kill in between leaves a run that is not marked
        # complete, which --resume computes again)
        rundir.remove_checkpoints(ckpt_dir)
        save_json(meta_path, meta)
    return {"data": data_path, "metadata": meta_path, "figures": figures, "results": results,
            "grids": meta.get("grids"), "continued": continued}


def _mark(meta_path: Path, meta: dict) -> None:
    """Record how a started run ended (best effort: the disk may be what failed)."""
    with signals_deferred():
        try:
            save_json(meta_path, meta)
        except OSError:
            pass


# ----------------------------------------------------------------------------- a finished run


def load_run(run_dir: Path, find):
    """``(experiment, config, result)`` of the complete run saved in ``run_dir``; ``find(name)``
    gives the experiment a run names (the registry's lookup).

    Raises ValueError naming the problem for anything that is not a readable complete run:
    no such directory, no or damaged metadata, an unfinished run, a damaged or missing
    ``data.npz`` / ``results.nc``."""
    run_dir = Path(run_dir)
    meta = rundir.require_run(run_dir)
    if meta.get("status") != STATUS_COMPLETE:
        raise ValueError(f"the run in {str(run_dir)!r} is not complete (status "
                         f"{meta.get('status')!r}); finish it with --resume {run_dir}")
    exp = find(meta.get("experiment"))
    config = exp.config_from_mapping(meta.get("config", {}), source=f"{run_dir}/{METADATA_FILE}")
    try:
        result = Result.load(run_dir)
    except ValueError as e:
        if (run_dir / DATA_FILE).exists():
            raise
        raise ValueError(f"{str(run_dir)!r} holds no {DATA_FILE}, though its metadata says the run "
                         f"is complete; run it again") from e
    return exp, config, result


NONFINITE_KEY = "nonfinite_values"
"""The metadata key of :func:`nonfinite_counts` of the saved result: the NaN and inf a run meant
(a censored time, a statistic undefined at the first layer), so ``plot`` can tell them from data
that became non-finite after the run."""


def nonfinite_counts(result: Result) -> dict[str, int]:
    """Per floating array of a result that holds NaN or inf, how many: ``data.npz`` arrays by
    name, grid variables as ``grid/variable``."""
    arrays = dict(result.arrays)
    for grid, ds in result.grids.items():
        arrays.update({f"{grid}/{name}": np.asarray(v.values) for name, v in ds.variables.items()})
    counts = {name: int(np.size(a) - np.count_nonzero(np.isfinite(a))) for name, a in arrays.items()
              if np.issubdtype(np.asarray(a).dtype, np.inexact)}
    return {name: c for name, c in counts.items() if c}


def _describe_nonfinite(counts: dict[str, int], result: Result, limit: int = 8) -> str:
    def size(name):
        grid, _, var = name.partition("/")
        return result.arrays[name].size if not var else result.grids[grid][var].size

    items = [f"{name} ({c} of {size(name)})" for name, c in counts.items()]
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check_plottable(run_dir: Path, meta: dict, result: Result) -> None:
    """Refuse to draw a result holding NaN or inf the run did not save: its arrays changed after
    the run (a figure of them would be empty or partial, and ``plot`` exit 0). A run saved
    before the count was recorded is checked by its figures alone (:func:`redraw`)."""
    saved = meta.get(NONFINITE_KEY)
    if not isinstance(saved, dict):
        return
    now = nonfinite_counts(result)
    grown = {k: c for k, c in now.items() if c > int(saved.get(k, 0))}
    if grown:
        raise ValueError(f"cannot draw the figures of {str(run_dir)!r}: its saved data hold NaN or inf "
                         f"values the run did not save, in {_describe_nonfinite(grown, result)} (the run "
                         f"recorded {sum(int(v) for v in saved.values())} such values); its {DATA_FILE} or "
                         f"{GRIDS_FILE} changed after the run: run it again")


def redraw(run_dir: Path, find, out_dir: Path | None = None) -> list[str]:
    """Draw the figures of the complete run in ``run_dir`` again, from its saved result (no
    recomputation), into ``out_dir`` (default: ``run_dir``, locked while drawing); ``find`` as
    for :func:`load_run`. Returns the figure paths."""
    run_dir = Path(run_dir)
    out_dir = Path(run_dir if out_dir is None else out_dir)
    in_place = out_dir == run_dir and run_dir.is_dir()
    from ..plot import EmptyFigureError  # matplotlib only when drawing

    with rundir.locked(run_dir) if in_place else contextlib.nullcontext():
        exp, config, result = load_run(run_dir, find)
        check_plottable(run_dir, rundir.read_metadata(run_dir) or {}, result)
        if not in_place:
            rundir.make_directory(out_dir)
        try:
            return [str(p) for p in exp.figures(result, config, out_dir)]
        except (EmptyFigureError, KeyError, IndexError, TypeError, ValueError) as e:
            nonfinite = nonfinite_counts(result)
            if nonfinite:  # the likelier cause, named (not "does not match its metadata")
                raise ValueError(f"cannot draw the figures of {str(run_dir)!r}: its saved data hold NaN or "
                                 f"inf in {_describe_nonfinite(nonfinite, result)} "
                                 f"({rundir.error_text(e)})") from None
            if isinstance(e, EmptyFigureError):
                raise ValueError(f"cannot draw the figures of {str(run_dir)!r}: {e}") from None
            raise ValueError(f"cannot draw the figures of {str(run_dir)!r} from its saved "
                             f"{DATA_FILE} ({rundir.error_text(e)}): it does not match the run's "
                             f"{METADATA_FILE}") from None


__all__ = ["FailedRun", "InterruptedRun", "load_run", "redraw", "run_experiment"]
