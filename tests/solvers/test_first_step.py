"""``with_first_step``: diffeqsolve given dt0=None and the first step through the controller takes
the same steps, bit for bit, as diffeqsolve given dt0 (the reference: diffrax itself)."""

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_pde.solvers.first_step import with_first_step


def _solve(controller, dt0, wrapped, solver=None):
    solver = diffrax.Tsit5() if solver is None else solver
    term = diffrax.ODETerm(lambda t, y, args: -y * jnp.sin(3 * t) + jnp.cos(t))
    ts = jnp.linspace(0.0, 2.0, 7)
    if wrapped:
        controller, dt0 = with_first_step(controller, jnp.asarray(dt0)), None
    sol = diffrax.diffeqsolve(term, solver, 0.0, 2.0, dt0, jnp.array([1.0, -0.5]), saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=controller, max_steps=4096)
    return np.asarray(sol.ys), int(sol.stats["num_accepted_steps"]), int(sol.stats["num_rejected_steps"])


@pytest.mark.parametrize("controller", [
    diffrax.ConstantStepSize(),
    diffrax.PIDController(rtol=1e-6, atol=1e-8),
    diffrax.ClipStepSizeController(diffrax.PIDController(rtol=1e-5, atol=1e-7), jump_ts=jnp.array([0.7])),
], ids=["constant", "pid", "clipped"])
def test_the_first_step_through_the_controller_takes_the_same_steps(controller):
    ys, accepted, rejected = _solve(controller, 0.13, wrapped=True)
    ref_ys, ref_accepted, ref_rejected = _solve(controller, 0.13, wrapped=False)
    np.testing.assert_array_equal(ys, ref_ys)
    assert (accepted, rejected) == (ref_accepted, ref_rejected) and accepted > 1
    adaptive = isinstance(controller, diffrax.AbstractAdaptiveStepSizeController)
    wrapper = with_first_step(controller, jnp.asarray(0.1))
    assert isinstance(wrapper, diffrax.AbstractAdaptiveStepSizeController) == adaptive


def test_an_implicit_solver_reads_the_tolerances_through_the_wrapper():
    """diffrax gives an implicit solver the adaptive controller's rtol/atol (refused for a constant
    controller): the wrapper passes them on, and the steps are the same."""
    pid = diffrax.PIDController(rtol=1e-5, atol=1e-7)
    wrapped = _solve(pid, 0.05, wrapped=True, solver=diffrax.Kvaerno3())
    ref = _solve(pid, 0.05, wrapped=False, solver=diffrax.Kvaerno3())
    np.testing.assert_array_equal(wrapped[0], ref[0])
    assert wrapped[1:] == ref[1:]
