"""Helpers shared by the experiments (not experiments themselves)."""

from __future__ import annotations

import numpy as np

from .._lazy import jnp


def circle_angles(x):
    """Angles in (−π, π] of tokens on S^1 (shape ``(..., n, 2)``)."""
    return jnp.arctan2(x[..., 1], x[..., 0])


def pid(rtol: float, dtype, atol_ratio: float = 1e-2):
    """A PID controller whose tolerance is reachable in ``dtype`` (float32 runs use at least
    100 machine epsilons: a smaller rtol only exhausts max_steps)."""
    import diffrax

    rtol = max(float(rtol), 100 * float(np.finfo(np.dtype(dtype)).eps))
    return diffrax.PIDController(rtol=rtol, atol=rtol * atol_ratio)


STAGE_RADIUS = 1.25
"""The bound on |x| that the experiments declare to the fast kernel for unit tokens integrated by
a Runge–Kutta solver: the stages of a step leave the sphere (|x|² = 1 + O(h²); the radius-1 plan
stopped a Tsit5 run of n = 10⁶, dt = 0.1 at its first step). Euler layers evaluate on the sphere
and declare 1."""


def kernel_backend(name: str, tol: float, radius: float = STAGE_RADIUS):
    """The kernel backend object an experiment's ``backend`` option names (mapped once, here):
    ``exact`` (dense / exact streaming), ``fast`` (NUFFT, planned error ``tol`` for tokens with
    |x| <= ``radius``), ``auto`` (fast where predicted cheaper and accurate, exact fallback;
    kernels/backends.py)."""
    from ..kernels import Auto, Exact, Fast

    return {"exact": lambda: Exact(), "fast": lambda: Fast(tol=tol, radius=radius),
            "auto": lambda: Auto(tol=tol, radius=radius)}[name]()
