"""Stop conditions of :func:`transformer_pde.solve`, as values (diffrax's ``event=``).

A finite-time blow-up (Riccati covariances, unnormalized attention, a step too large for the
parameters) must stop a run and say when, never fill it with NaN: :class:`BlowUp` is checked
after every accepted step (a ``diffrax.Event``), and the time the run stopped is reported by the
solution (``Solution.nonfinite_time``, ``GaussianSolution.blowup_time``).
"""

from __future__ import annotations

import equinox as eqx
import jax

from .._checks import check_scalar


class BlowUp(eqx.Module):
    """Stop at the first step whose state has left every bounded set: a NaN or inf anywhere,
    and for a :class:`~transformer_pde.Gaussian` a covariance trace above ``threshold``.

    Args:
        threshold: the largest tr Σ of a Gaussian state (default: 1e10 · tr Σ0 in float64, the
            largest growth the time grid resolves in lower precision,
            :func:`~transformer_pde.solvers.states.default_blowup_factor`). Particles stop on
            non-finite values only.

    ``tp.solve(..., event=tp.BlowUp())`` is the default; ``event=None`` integrates on whatever
    happens (and adjoints that exclude events, such as ``diffrax.ImplicitAdjoint``, need it).
    """

    threshold: float | jax.Array | None = None

    def __check_init__(self):
        if self.threshold is not None:
            check_scalar(self.threshold, "BlowUp.threshold", positive=True)


__all__ = ["BlowUp"]
