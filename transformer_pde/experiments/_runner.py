"""Run an experiment into a directory: data, metadata and figures, written atomically.

Layout of an output directory::

    metadata.json   status ("running" | "interrupted" | "failed" | "complete"), experiment, config, seed,
                    package versions, JAX backend and devices, git commit, timings
    config.json     the resolved options (JSON)
    config.toml     the same, loadable with ``--config`` to rerun
    checkpoints/    chunk files of a resumable run in progress (removed once complete)
    data.npz        the arrays of the :class:`~._result.Result` of ``compute`` (once complete)
    results.nc      its labelled grids (netCDF-4, one group each), for experiments that have them
    *.png           figures (``transformer-pde plot DIR`` redraws them from the saved result)

Every file is written to a temporary file in the same directory and renamed into place, so
a run killed at any instant (SIGKILL included) leaves each file either absent, or old, or
complete. ``data.npz`` is written deterministically (fixed zip timestamps), so the same
command and seed give byte-identical data files.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata as importlib_metadata
from pathlib import Path

from .._io import atomic_write_bytes, npz_bytes, save_json  # noqa: F401  (npz_bytes: re-exported)
from ._base import Experiment, config_to_toml, get
from ._result import DATA_FILE, GRIDS_FILE, Result

_PACKAGES = ("transformer_pde", "jax", "jaxlib", "equinox", "diffrax", "ott-jax", "optax",
             "numpy", "matplotlib", "xarray", "h5netcdf")

STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_FAILED, STATUS_COMPLETE = (
    "running", "interrupted", "failed", "complete")


class RunInterrupted(BaseException):
    """Raised (from a signal handler) to stop a run cleanly; ``signum`` is the signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


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


def read_metadata(out_dir: Path) -> dict | None:
    path = Path(out_dir) / "metadata.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e}); not an output directory of "
                         "transformer-pde") from None


def _remove_stale_temporaries(out_dir: Path) -> None:
    """Temporary files left by a SIGKILL during a write (renames never happened)."""
    for tmp in list(out_dir.glob(".*.tmp")) + list(out_dir.glob("checkpoints/*/.*.tmp")):
        tmp.unlink(missing_ok=True)


def run_experiment(exp: Experiment, config, out_dir: Path, *, progress: bool = True,
                   checkpoint_every: int | None = None, resume: bool = False) -> dict:
    """Compute, save ``data.npz``, ``config.json``, ``config.toml``, ``metadata.json``, figures.

    Args:
        exp, config: the experiment and its resolved options.
        out_dir: output directory (created).
        progress: show progress bars.
        checkpoint_every: for resumable experiments, chunk length in save intervals
            (default :data:`transformer_pde.checkpoint.DEFAULT_EVERY`).
        resume: continue the unfinished run in ``out_dir`` from its checkpoints (the caller
            passes that run's saved config; see the CLI's ``--resume``).

    A directory holding an unfinished run is never silently restarted: pass ``resume=True``,
    or remove it. Returns ``{"data", "metadata", "figures", "results", "grids"}``
    (``results``: the :class:`~._result.Result`; ``grids``: the ``results.nc`` path or None).
    """
    from ..solvers import DEFAULT_EVERY, Checkpoint

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output path {str(out_dir)!r} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out_dir)
    previous = read_metadata(out_dir)
    ckpt_dir = out_dir / "checkpoints"
    if resume:
        if previous is None:
            raise ValueError(f"nothing to resume in {str(out_dir)!r}: no metadata.json")
        if previous.get("experiment") != exp.name:
            raise ValueError(f"{str(out_dir)!r} holds a run of {previous.get('experiment')!r}, "
                             f"not {exp.name!r}")
        checkpoint_every = previous.get("checkpoint_every") or checkpoint_every
    elif previous is not None and previous.get("status") != STATUS_COMPLETE:
        raise ValueError(f"{str(out_dir)!r} holds an unfinished run (status "
                         f"{previous.get('status')!r}); continue it with --resume "
                         f"{out_dir}, or remove the directory")
    elif ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)  # leftovers of a completed run's checkpoints

    cfg = dataclasses.asdict(config)
    checkpoint = None
    if exp.resumable:
        checkpoint = Checkpoint(ckpt_dir, checkpoint_every or DEFAULT_EVERY)
    save_json(out_dir / "config.json", cfg)
    atomic_write_bytes(out_dir / "config.toml", config_to_toml(exp, config).encode())
    meta = {
        "experiment": exp.name,
        "summary": exp.summary,
        "config": cfg,
        "seed": cfg.get("seed"),
        "resumable": exp.resumable,
        "checkpoint_every": None if checkpoint is None else checkpoint.every,
        "created": (previous or {}).get("created") if resume else time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "resumed": ((previous or {}).get("resumed", 0) + 1) if resume else 0,
        **environment(),
    }
    meta_path = out_dir / "metadata.json"
    save_json(meta_path, {**meta, "status": STATUS_RUNNING})

    start = time.perf_counter()
    data_path = out_dir / DATA_FILE
    try:
        if exp.resumable:
            results = exp.compute(config, progress, checkpoint=checkpoint)
        else:
            results = exp.compute(config, progress)
        wall = time.perf_counter() - start
        if not isinstance(results, Result):
            raise ValueError(f"experiment '{exp.name}': compute must return a Result, got "
                             f"{type(results).__name__}")
        written = results.save(out_dir)
        figures = [str(p) for p in exp.figures(results, config, out_dir)]
    except (KeyboardInterrupt, RunInterrupted):
        save_json(meta_path, {**meta, "status": STATUS_INTERRUPTED,
                              "wall_time_s": time.perf_counter() - start})
        raise
    except BaseException as e:
        save_json(meta_path, {**meta, "status": STATUS_FAILED, "error": repr(e),
                              "wall_time_s": time.perf_counter() - start})
        raise
    meta.update({"status": STATUS_COMPLETE, "wall_time_s": wall, "figures": figures,
                 "data": str(data_path), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    if out_dir / GRIDS_FILE in written:
        meta["grids"] = str(out_dir / GRIDS_FILE)
    save_json(meta_path, meta)
    if ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)  # the data file now holds everything the checkpoints did
    return {"data": data_path, "metadata": meta_path, "figures": figures, "results": results,
            "grids": meta.get("grids")}


def load_run(run_dir: Path):
    """``(experiment, config, result)`` of the complete run saved in ``run_dir``."""
    run_dir = Path(run_dir)
    meta = read_metadata(run_dir)
    if meta is None:
        raise ValueError(f"{str(run_dir)!r} holds no run (metadata.json is missing)")
    if meta.get("status") != STATUS_COMPLETE:
        raise ValueError(f"the run in {str(run_dir)!r} is not complete (status "
                         f"{meta.get('status')!r}); finish it with --resume {run_dir}")
    exp = get(meta.get("experiment"))
    config = exp.config_from_mapping(meta.get("config", {}), source=f"{run_dir}/metadata.json")
    return exp, config, Result.load(run_dir)


def redraw(run_dir: Path, out_dir: Path | None = None) -> list[str]:
    """Draw the figures of the complete run in ``run_dir`` again, from its saved result (no
    recomputation), into ``out_dir`` (default: ``run_dir``). Returns the figure paths."""
    exp, config, result = load_run(run_dir)
    out_dir = Path(run_dir if out_dir is None else out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"output path {str(out_dir)!r} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    return [str(p) for p in exp.figures(result, config, out_dir)]
