"""Piecewise-constant parameters under a solver of order > 1: a step that ends on a layer
boundary must see the layer it belongs to in every stage (its c = 1 stage included), so the
solver keeps its order. Oracle: x' = V(t) x with V piecewise constant (one token: softmax
attention averages over itself, Γ(x) = V x), whose flow is the product of matrix exponentials."""

import diffrax
import numpy as np
import pytest
from _kept import stored_programs
import scipy.linalg

import transformer_pde as tp

L, T1 = 4, 1.0


def _problem():
    rng = np.random.default_rng(3)
    Vs = 0.5 * rng.normal(size=(L, 3, 3))
    x0 = rng.normal(size=(1, 3))
    exact = x0[0]
    for V in Vs:
        exact = scipy.linalg.expm(V * T1 / L) @ exact
    eye = np.eye(3)
    return tp.SoftmaxAttention(eye, eye, tp.PiecewiseConstant(Vs, dt=T1 / L), beta=1.0), x0, exact


def test_heun_with_steps_ending_on_layer_boundaries_is_second_order():
    """Heun at dt = (layer length)/m: every m-th step ends on a boundary. Measured: errors fall 4x
    per halving (slope 2); with the next layer's V in the c = 1 stage they fell 2x (slope 1)."""
    dyn, x0, exact = _problem()
    ms = [2, 4, 8]
    errs = [np.abs(np.asarray(tp.solve(dyn, x0, t1=T1, dt0=T1 / L / m, solver=diffrax.Heun()).final[0])
                   - exact).max() for m in ms]
    slopes = -np.diff(np.log(errs)) / np.log(2)
    assert np.all(slopes > 1.8), (errs, slopes)


@pytest.mark.slow
@pytest.mark.parametrize("dt0", [0.1, 0.3])
def test_boundaries_off_the_step_grid(dt0):
    """dt0 that does not divide the layer length: the solve steps to the boundaries too, so
    Tsit5 is exact to its local error (no step straddles a switch)."""
    dyn, x0, exact = _problem()
    out = tp.solve(dyn, x0, t1=T1, dt0=dt0 / 8, solver=diffrax.Tsit5())
    np.testing.assert_allclose(np.asarray(out.final[0]), exact, rtol=0, atol=1e-8)


def test_adaptive_steps_jump_at_the_boundaries():
    dyn, x0, exact = _problem()
    out = tp.solve(dyn, x0, t1=T1, dt0=0.01, solver=diffrax.Tsit5(),
                   stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12))
    np.testing.assert_allclose(np.asarray(out.final[0]), exact, rtol=0, atol=1e-8)


def test_left_open_right_closed_layers():
    """values[l] on [t0 + l dt, t0 + (l+1) dt): the boundary itself is the next layer, the float
    just below it the previous one."""
    pc = tp.PiecewiseConstant(np.arange(4.0), t0=0.5, dt=0.25)
    for l in range(1, 4):
        b = np.float64(0.5 + 0.25 * l)
        assert float(pc(b)) == l and float(pc(np.nextafter(b, -np.inf))) == l - 1
    assert float(pc(-3.0)) == 0 and float(pc(9.0)) == 3


def test_numpy_values_inside_a_traced_solve():
    """Layers built from NumPy arrays are selected by a traced time: in a jitted call, and in the
    Gaussian closure's solve (it failed on indexing a NumPy array with a tracer). Oracle: with
    Q = K = 0 every token sees the mean, so m' = V(t) m (the product of exponentials) and Σ stays."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    Vs = 0.5 * rng.normal(size=(L, 3, 3))
    pc = tp.PiecewiseConstant(Vs, dt=T1 / L)
    np.testing.assert_array_equal(jax.jit(lambda t: pc(t))(0.6), Vs[2])
    m0 = rng.normal(size=3)
    exact = m0
    for V in Vs:
        exact = scipy.linalg.expm(V * T1 / L) @ exact
    zero = np.zeros((3, 3))
    sol = tp.solve(tp.SoftmaxAttention(zero, zero, pc, beta=1.0), tp.Gaussian(m0, np.eye(3)), t1=T1,
                   dt0=T1 / (8 * L), solver=diffrax.Tsit5())
    np.testing.assert_allclose(sol.final_mean, exact, atol=1e-9)
    np.testing.assert_allclose(sol.final_cov, np.eye(3), atol=1e-12)


def test_a_kept_solve_stepping_to_the_boundaries_is_kept_and_exact(tmp_path, monkeypatch):
    """Constant steps stop at each layer boundary (a StepTo grid whose check of its ends is the
    library's): a kept solve keeps its program (no host callback in it) and its numbers are the
    plain solve's, bit for bit, and the product of matrix exponentials."""
    from transformer_pde.runs import programs

    monkeypatch.setattr(programs, "program_dir", lambda: tmp_path / "programs")
    monkeypatch.setattr(programs, "_CALLS", {})
    monkeypatch.setattr(programs, "_BY_KEY", {})
    dyn, x0, exact = _problem()
    plain = tp.solve(dyn, x0, t1=T1, dt0=T1 / L / 4, solver=diffrax.Tsit5()).final
    with tp.runs.kept_programs():
        kept = tp.solve(dyn, x0, t1=T1, dt0=T1 / L / 4, solver=diffrax.Tsit5()).final
    assert stored_programs(tmp_path / "programs") == [".jaxcall"]
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(plain))
    np.testing.assert_allclose(np.asarray(kept[0]), exact, rtol=0, atol=1e-8)
