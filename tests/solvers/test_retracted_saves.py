"""tp.Retracted: saves read the retracted state (issue 25 cause 7).

Rotation on the circle, y' = J y: the exact flow stays on |y| = 1, y(t) = (cos t, sin t).
"""

from __future__ import annotations

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.models import UnitSphere

TERM = diffrax.ODETerm(lambda t, y, args: jnp.stack([-y[:, 1], y[:, 0]], axis=1))
Y0 = jnp.array([[1.0, 0.0]])  # one token on S^1


@pytest.mark.parametrize("solver", [diffrax.Euler(), diffrax.Tsit5()])
def test_saves_at_step_times_are_on_the_manifold(solver):
    ts = jnp.linspace(0.0, 1.0, 11)  # every step time (dt0 = 0.1)
    sol = diffrax.diffeqsolve(TERM, tp.Retracted(solver, UnitSphere()), 0.0, 1.0, 0.1, Y0,
                              saveat=diffrax.SaveAt(ts=ts))
    np.testing.assert_allclose(np.linalg.norm(sol.ys[:, 0], axis=1), 1.0, atol=1e-14)


def test_saves_between_steps_keep_the_solver_order():
    """Tsit5 (order 5) saved half-way between steps: error against (cos t, sin t) shrinks ~2^5
    when dt0 halves (the interpolant's correction is O(step error))."""
    errs = []
    for dt in (0.2, 0.1):
        ts = jnp.arange(1, 10) * 0.1 + dt / 2
        ts = ts[ts < 1.0]
        sol = diffrax.diffeqsolve(TERM, tp.Retracted(diffrax.Tsit5(), UnitSphere()), 0.0, 1.0, dt, Y0,
                                  saveat=diffrax.SaveAt(ts=ts))
        exact = np.stack([np.cos(ts), np.sin(ts)], axis=1)
        errs.append(np.abs(np.asarray(sol.ys[:, 0]) - exact).max())
    assert errs[1] < 1e-6
    assert errs[0] / errs[1] > 8  # order >= 3 (dense interpolation of Tsit5 is order 4)


def test_dense_output_ends_steps_on_the_manifold():
    sol = diffrax.diffeqsolve(TERM, tp.Retracted(diffrax.Euler(), UnitSphere()), 0.0, 1.0, 0.1, Y0,
                              saveat=diffrax.SaveAt(dense=True, t1=True))
    for t in np.linspace(0.0, 1.0, 11):
        assert abs(float(jnp.linalg.norm(sol.evaluate(t))) - 1.0) < 1e-14
