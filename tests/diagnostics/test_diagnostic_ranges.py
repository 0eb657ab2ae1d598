"""Numbers accepted only within their meaning (issue 25 cause 5), diagnostics: a cosine
threshold lies in [-1, 1), a distance threshold is > 0, a rank tolerance in [0, 1), weights are
a probability vector -- refused naming the parameter, concrete or under jit."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.diagnostics import Euclidean

X = tp.normalize(jax.random.normal(jax.random.key(0), (5, 3)))


@pytest.mark.parametrize("threshold", [1.0, 2.0, -2.0, np.nan, np.inf])
def test_cosine_threshold_outside_its_meaning_is_refused(threshold):
    with pytest.raises(ValueError, match=r"threshold must (lie in \[-1, 1\) \(a cosine|be finite, got)"):
        tp.diagnostics.cluster_count(X, threshold)


def test_cosine_threshold_is_checked_under_jit():
    f = eqx.filter_jit(tp.diagnostics.cluster_count)
    assert int(f(X, jnp.asarray(0.5))) == int(tp.diagnostics.cluster_count(X, 0.5))
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"threshold must lie in \[-1, 1\)"):
        f(X, jnp.asarray(1.0))


def test_identical_float32_tokens_are_one_cluster_at_the_largest_valid_threshold():
    x = jnp.tile(tp.normalize(jnp.ones((1, 3), jnp.float32)), (8, 1))
    assert int(tp.diagnostics.cluster_count(x, np.nextafter(np.float32(1), np.float32(0)) - 1e-6)) == 1


def test_distance_threshold_must_be_positive():
    with pytest.raises(ValueError, match=r"threshold must be > 0 \(a distance"):
        tp.diagnostics.cluster_count(X, 0.0, metric=Euclidean())
    assert int(tp.diagnostics.cluster_count(X, 10.0, metric=Euclidean())) == 1


@pytest.mark.parametrize("rtol", [-1e-3, np.nan, 1.0])
def test_numerical_rank_rtol(rtol):
    with pytest.raises(ValueError, match=r"rtol must (lie in \[0, 1\)|be finite, got)"):
        tp.diagnostics.numerical_rank(jnp.eye(3), rtol)
    assert int(tp.diagnostics.numerical_rank(jnp.diag(jnp.array([1.0, 1e-2, 1e-5])), 1e-3)) == 2


def test_energy_weights_must_be_a_probability_vector():
    w = jnp.full(5, 0.4)  # sums to 2
    with pytest.raises(ValueError, match="weights must sum to 1"):
        tp.diagnostics.normalized_energy(X, 1.0, w)
    with pytest.raises(ValueError, match="weights must be non-negative"):
        tp.diagnostics.attention_matrix(X, 1.0, weights=jnp.array([0.5, 0.5, 0.5, -0.5, 0.0]))
    # the uniform measure: φ = mean of e^{β(<x_i, x_j> - 1)} (an independent NumPy sum)
    xn = np.asarray(X)
    expect = np.mean(np.exp(2.0 * (xn @ xn.T - 1.0)))
    np.testing.assert_allclose(tp.diagnostics.normalized_energy(X, 2.0, jnp.full(5, 0.2)), expect, rtol=1e-12)
