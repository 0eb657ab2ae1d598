"""Tiny runs of the registered experiments, shared by the test modules.

Each experiment runs once per test session at its ``tiny`` size, through the runner (data,
grids, metadata and figures written to disk), and every test reads the *saved* result back
(``Result.load``). Under pytest-xdist the workers share one directory and a file lock, so an
experiment still runs once however its tests are spread; ``tests/experiments/test_registry.py`` checks
every run (figures drawn, redrawn by ``transformer-pde plot``), the other modules check the
outcomes of theirs.
"""

from __future__ import annotations

import fcntl
import os
import shutil

from transformer_pde.experiments import get
from transformer_pde.runs import load_run, run_experiment
from transformer_pde.runs.directory import read_metadata

_CACHE: dict = {}


def runs_root(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's basetemp is .../pytest-N/popen-gwK: share the session's parent
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny_runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def tiny_run(name: str, tmp_path_factory):
    """``(result, config, run_dir)`` of experiment ``name`` at its tiny size, run at most once."""
    if name not in _CACHE:
        root = runs_root(tmp_path_factory)
        run_dir = root / name
        with open(root / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            meta = read_metadata(run_dir) if run_dir.exists() else None
            if meta is None or meta.get("status") != "complete":
                shutil.rmtree(run_dir, ignore_errors=True)  # a failed attempt: start afresh
                exp = get(name)
                run_experiment(exp, exp.make_config(**exp.tiny), run_dir, progress=False)
        _, config, result = load_run(run_dir, get)
        _CACHE[name] = (result, config, run_dir)
    return _CACHE[name]
