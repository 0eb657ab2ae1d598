"""Numbers within their meaning and errors from the right layer (issue 25 causes 5, 6): tp.fit's
steps and a sweep's dtype and chunk size are refused, never truncated; a diverging optimizer is
named with its step and a hint, not as a bare solve error."""

from __future__ import annotations

import diffrax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import transformer_pde as tp


@pytest.mark.package_errors
def test_fit_steps_must_be_an_integer():
    m = tp.SoftmaxAttention.identity(2)
    with pytest.raises(ValueError, match="steps must be an integer, got 2.5"):
        tp.fit(m, lambda m: jnp.sum(m.V ** 2), optimizer=optax.sgd(0.1), steps=2.5)


@pytest.mark.slow
def test_a_diverging_optimizer_is_named_with_its_step():
    """A gradient step of 1e100 on -ΣV: after it V ~ 1e100 and four Euler steps of 0.25 take the
    tokens to ~1e398, past float64: the solve's blow-up check fires inside the loss."""
    x0 = tp.normalize(jnp.array([[1.0, 0.2], [0.3, 1.0], [-1.0, 0.5]]))

    def loss(m):
        sol = tp.solve(m, x0, t1=1.0, dt0=0.25, solver=diffrax.Euler())
        return -jnp.sum(m.V) + 0.0 * jnp.sum(sol.xs[-1])

    with pytest.raises(ValueError, match=r"fit: the optimizer diverged at step 1 of 5.*lower the "
                                         r"learning rate") as e:
        tp.fit(tp.SoftmaxAttention.identity(2), loss, optimizer=optax.sgd(1e100), steps=5)
    assert "the state became non-finite" in str(e.value)


@pytest.mark.package_errors
def test_sweep_dtype_must_be_floating():
    with pytest.raises(ValueError, match="dtype must be a floating dtype.*int32"):
        tp.sweep(lambda beta: beta, {"beta": [0.5, 1.5]}, dtype=jnp.int32)
    with pytest.raises(ValueError, match="chunk_size must be an integer, got 1.5"):
        tp.sweep(lambda beta: beta, {"beta": [0.5, 1.5]}, chunk_size=1.5)
    out = tp.sweep(lambda beta: 2 * beta, {"beta": [0.5, 1.5]})
    np.testing.assert_array_equal(out.values, [1.0, 3.0])
