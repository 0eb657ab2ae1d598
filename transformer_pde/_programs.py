"""How a concrete ``tp.solve`` runs its program: a context variable, set by the runs layer.

None (the default): under the solve's own ``eqx.filter_jit``. Else ``runner(fn, args)``, which
returns ``fn(*args)`` as ``eqx.filter_jit(fn)`` would, or None to leave the call to that:
:func:`transformer_pde.runs.programs.kept_programs` sets it to
:func:`~transformer_pde.runs.programs.call_kept`, which keeps the traced program between processes.
Light on purpose (no JAX): the runs layer sets it before anything is traced.
"""

from __future__ import annotations

import contextvars

SOLVE_RUNNER: contextvars.ContextVar = contextvars.ContextVar("transformer_pde_solve_runner", default=None)

CHECK_REPORTER: contextvars.ContextVar = contextvars.ContextVar("transformer_pde_check_reporter", default=None)
"""How the library's runtime checks (:func:`transformer_pde._checks.runtime_check`) are traced.
None (the default): as ``eqx.error_if``. Else ``report(x, pred, index, msgs)``, which makes the
check a value of the program being traced and returns ``x``: :mod:`transformer_pde.runs.reported_checks`
sets it while it traces a program to keep. A context variable, so another thread tracing at the same
time is not affected."""


def run_program(fn, jitted, args: tuple):
    """``fn(*args)`` through the runner when one is set and can keep it, else ``jitted(*args)``
    (``eqx.filter_jit(fn)``): how ``tp.solve``, a study's runner, a sweep's chunks and
    :class:`~transformer_pde.runs.Kept` run their programs."""
    runner = SOLVE_RUNNER.get()
    out = None if runner is None else runner(fn, args)
    return jitted(*args) if out is None else out
