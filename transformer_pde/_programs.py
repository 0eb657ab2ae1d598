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
