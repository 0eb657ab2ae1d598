"""Checks that hold under jit, and messages that name only what was checked (issue 25 cause 3),
plus errors from the right layer for solve's inputs (cause 6)."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp

ATTN = tp.SoftmaxAttention.identity(2, 1.0)
X = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])


def test_t1_before_t0_under_jit_names_the_times():
    f = eqx.filter_jit(lambda t1: tp.solve(ATTN, X, t1=t1, dt0=0.1).xs)
    with pytest.raises(eqx.EquinoxRuntimeError, match="solve: must have t1 > t0"):
        f(jnp.asarray(-1.0))


@pytest.mark.parametrize("cov, message", [
    (jnp.array([[1.0, 0.0], [0.0, -1.0]]), "Gaussian.cov must be positive definite"),
    (jnp.array([[1.0, 0.5], [0.0, 1.0]]), "Gaussian.cov must be symmetric"),
])
def test_gaussian_covariance_is_checked_under_jit(cov, message):
    f = eqx.filter_jit(lambda c: tp.Gaussian(jnp.zeros(2), c).cov)
    np.testing.assert_array_equal(f(jnp.eye(2)), jnp.eye(2))
    with pytest.raises(eqx.EquinoxRuntimeError, match=message):
        f(cov)
    with pytest.raises(ValueError, match=message):
        tp.Gaussian(jnp.zeros(2), cov)


def test_a_nonfinite_velocity_names_a_nonfinite_parameter():
    # constructors refuse NaN; a parameter that went bad later (an optimizer step) does not pass one
    bad = eqx.tree_at(lambda a: a.V, ATTN, jnp.eye(2).at[0, 0].set(jnp.nan))
    with pytest.raises(ValueError, match=r"the parameter\(s\) .*V.* hold NaN or inf") as e:
        bad.velocity(X)
    assert "overflow" not in str(e.value)
    with pytest.raises(eqx.EquinoxRuntimeError, match="a parameter holds NaN or inf"):
        eqx.filter_jit(lambda a, x: a.velocity(x))(bad, X)


def test_a_nonfinite_velocity_with_no_cause_found_says_so():
    """An MLP whose activation returns NaN: no parameter is bad and the tokens are small, so
    the message says what was checked and names no overflow."""
    mlp = tp.MLP(jnp.eye(2), jnp.zeros(2), jnp.eye(2), jnp.zeros(2), activation=lambda s: s * jnp.nan)
    with pytest.raises(ValueError, match="no non-finite parameter and no token too large") as e:
        mlp.velocity(X)
    assert "overflow" not in str(e.value)


@pytest.mark.package_errors
def test_inputs_named_at_the_right_layer():
    with pytest.raises(ValueError, match="must be a rectangular array"):
        tp.solve(ATTN, [[1.0, 0.0], [1.0]], t1=1.0, dt0=0.1)
    with pytest.raises(ValueError, match="n must be an integer, got 2.5"):
        tp.uniform_sphere(jax.random.key(0), 2.5, 3)
    with pytest.raises(ValueError, match="key must be a JAX random key"):
        tp.uniform_sphere(None, 2, 3)
    with pytest.raises(ValueError, match="solver must be a diffrax solver"):
        tp.solve(ATTN, X, t1=1.0, dt0=0.1, solver="tsit5")
    with pytest.raises(ValueError, match="SaveAt fn must return arrays.*str"):
        tp.solve(ATTN, X, t1=1.0, dt0=0.5, saveat=diffrax.SaveAt(ts=jnp.array([1.0]), fn=lambda t, x, a: "m"))


def test_a_saveat_fn_returning_a_python_number_is_saved():
    """... as an integer array, with no RuntimeWarning from diffrax's inf pre-fill of the buffer."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sol = tp.solve(ATTN, X, t1=1.0, dt0=0.5, solver=diffrax.Euler(),
                       saveat=diffrax.SaveAt(ts=jnp.array([0.5, 1.0]), fn=lambda t, x, a: 3))
    np.testing.assert_array_equal(sol.stats, [3, 3])


def test_save_times_given_as_values_are_checked_while_tracing():
    """Under a caller's jit, save times and a span given as numbers are checked before the program
    (ValueError naming them) and the program holds no check of them (no host callback, so it can be
    kept); times the caller traces are still checked inside it."""
    x0 = jnp.array([[0.0], [0.3], [1.0]])
    model = tp.MeanShift(4.0)

    def saved(x, ts):
        tp.runs.finite_by_construction([x])
        return tp.solve(model, x, t1=2.0, dt0=0.25, solver=diffrax.Euler(), saveat=ts, throw=False).xs

    ts = np.array([0.0, 1.0, 2.0])
    lowered = jax.jit(lambda x: saved(x, ts)).lower(x0)
    assert "callback" not in lowered.as_text()
    np.testing.assert_allclose(lowered.compile()(x0), saved(x0, ts), rtol=1e-6)
    with pytest.raises(ValueError, match=r"must lie in \[t0, t1\] = \[0.0, 2.0\], got \[0.0, 3.0\]"):
        jax.jit(lambda x: saved(x, np.array([0.0, 3.0]))).lower(x0)
    with pytest.raises(ValueError, match="non-decreasing"):
        jax.jit(lambda x: saved(x, np.array([1.0, 0.5]))).lower(x0)
    traced = eqx.filter_jit(saved)
    with pytest.raises(eqx.EquinoxRuntimeError, match="saveat.ts must lie between t0 and t1"):
        traced(x0, jnp.array([0.0, 3.0]))
