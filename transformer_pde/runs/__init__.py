"""The runs layer: a run of an experiment in a directory, and resumable integration.

Above the library (``sweeps``, ``fitting``, ``convergence``) and below the experiments, one
idea per module:

* :mod:`.signals`: SIGINT/SIGTERM stop a run cleanly (at once, or at the next safe point);
* :mod:`.provenance`: versions, JAX backend and devices, git commit, command;
* :mod:`.layout`: the names of a run directory's files and statuses, reading its metadata;
* :mod:`.directory`: the run directory: files, status state machine, lock, identity, and the
  rule that a run removes only what it wrote;
* :mod:`.result`: :class:`Result`, what a run saves (``data.npz``, ``results.nc``);
* :mod:`.fingerprint`: :func:`run_fingerprint`, a run's identity (code, closures, arrays);
* :mod:`.checkpoint` and :mod:`.chunked`: :class:`Checkpoint` files and
  :func:`solve_checkpointed`, ``tp.solve`` in chunks as a host loop, resumable bitwise;
* :mod:`.run`: :func:`run_experiment`, :func:`load_run`, :func:`redraw`, and the exceptions
  :class:`FailedRun`, :class:`InterruptedRun` of a started run;
* :mod:`.nonfinite`: :class:`NonFiniteRun`, reported after a kept program found NaN or inf
  (:func:`raise_if_nonfinite`, naming the run's parameters);
* :mod:`.info`: :func:`run_info`, what ``transformer-pde info RUN_DIR`` prints;
* :mod:`.compile_cache`: JAX's persistent compilation cache for CLI runs (where it goes, how it
  is turned off);
* :mod:`.cache_contents`: :func:`cache_contents` and :func:`clear_compile_cache`, what that cache
  holds and removing what JAX and this package wrote there (``transformer-pde cache``);
* :mod:`.programs`: :func:`lower_program` and :func:`compile_program`, traced programs (and their
  executables) kept beside that cache
  (``jax.export``), so a second run neither traces nor compiles; keyed by what the program
  computes and checked against its key and payload hash on load; :func:`kept_programs`, in which
  :func:`run_experiment` computes: every concrete ``tp.solve`` keeps its program
  (:func:`call_kept`);
* :mod:`.kept_function`: :class:`Kept` (:func:`kept`), an experiment's own jitted (vmapped) function,
  its program kept as a solve's is;
* :mod:`.reported_checks`: a kept program's runtime checks of this library (``runtime_check``,
  ``eqx.error_if`` elsewhere) reported as values and raised after it with their messages, so that
  a program holding them can be kept.

Importing this package does not import JAX: :func:`solve_checkpointed` and
:func:`run_fingerprint` load :mod:`.chunked` on first use, :class:`Kept` :mod:`.kept_function`, :class:`NonFiniteRun` and
:func:`raise_if_nonfinite` :mod:`.nonfinite`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .cache_contents import CacheContents, cache_contents, clear_compile_cache
from .checkpoint import DEFAULT_EVERY, Checkpoint
from .info import run_info
from .programs import (
    call_kept,
    carry_checks,
    compile_program,
    finite_by_construction,
    kept_programs,
    lower_program,
    program_key,
    unit_row_tolerance,
    unit_rows_by_construction,
)
from .result import Result, grid
from .run import FailedRun, InterruptedRun, load_run, redraw, run_experiment
from .signals import SignalReceived, stop_on_signals

if TYPE_CHECKING:
    from .chunked import run_fingerprint, solve_checkpointed
    from .kept_function import Kept, kept
    from .nonfinite import NonFiniteRun, raise_if_nonfinite

_LAZY = {"Kept": ".kept_function", "kept": ".kept_function", "run_fingerprint": ".chunked", "solve_checkpointed": ".chunked", "NonFiniteRun": ".nonfinite",
         "raise_if_nonfinite": ".nonfinite"}


def __getattr__(name: str):
    if name in _LAZY:
        value = vars(importlib.import_module(_LAZY[name], __name__))[name]
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["CacheContents", "DEFAULT_EVERY", "Checkpoint", "FailedRun", "InterruptedRun", "Kept", "NonFiniteRun", "Result", "SignalReceived",
           "cache_contents", "call_kept", "carry_checks", "clear_compile_cache", "compile_program", "finite_by_construction", "grid", "kept", "kept_programs",
           "load_run", "lower_program", "program_key", "raise_if_nonfinite", "redraw", "run_experiment", "run_fingerprint", "run_info",
           "solve_checkpointed", "stop_on_signals", "unit_row_tolerance", "unit_rows_by_construction"]
