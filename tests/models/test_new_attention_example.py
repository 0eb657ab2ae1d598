"""Adding an attention variant: one class, written here in a test, touching no package file.

Cosine attention, Γ_μ(x) = Σ_j softmax_j(β cos∠(x, y_j) + log w_j) y_j, is defined below in a few
lines; because it is an :class:`tp.AbstractMaskableAttention` (it gives its field with the keys
masked by position) and an :class:`tp.AbstractNormalizedAttention` (an average of the tokens), it
works with ``velocity``, ``field``, ``tp.Sphere``, ``tp.solve``, ``tp.Sharded`` and ``tp.Causal``
(ALiBi included) with nothing registered anywhere. Checked against plain NumPy loops, and on the
sphere (where cos∠(x, y) = ⟨x, y⟩) against the library's softmax attention with Q = K = V = I.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp


def _unit(z):
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


class CosineAttention(tp.AbstractMaskableAttention, tp.AbstractNormalizedAttention):
    """Softmax of β cos∠(q, y_j) over the tokens, averaging them (V = I)."""

    beta: jax.Array
    d: int = eqx.field(static=True)

    def __init__(self, d: int, beta=1.0):
        self.d, self.beta = d, jnp.asarray(beta)

    @property
    def dim(self):
        return self.d

    def value_norm(self, t=0.0):
        return jnp.asarray(1.0)

    def _average(self, queries, x, bias, **mask):
        avg, _ = tp.kernels.lse_average(self.beta * _unit(queries), _unit(x), x, bias, **mask)
        return avg

    def query_field(self, queries, x, weights, t, query_offset=0):
        return self._average(queries, x, jnp.log(weights))

    def causal_field(self, queries, x, weights, t, query_offset, key_bias=None):
        bias = jnp.log(weights) if key_bias is None else jnp.log(weights) + key_bias
        return self._average(queries, x, bias, causal=True, query_offset=query_offset)


def numpy_cosine(x, w, beta, *, causal=False, alibi=0.0, include_self=True):
    """Token i's velocity by a plain loop (keys j <= i, or j < i, when causal; ALiBi e^{-λ(i-j)/n})."""
    n = len(x)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    out = np.zeros_like(x)
    for i in range(n):
        keys = [j for j in range(n) if not causal or (j <= i if include_self else j < i)]
        if not keys:
            continue
        logits = np.array([beta * u[i] @ u[j] + np.log(w[j]) - alibi * (i - j) / n for j in keys])
        p = np.exp(logits - logits.max())
        out[i] = (p / p.sum()) @ x[keys]
    return out


N, D, BETA = 9, 3, 1.7
X = np.random.default_rng(0).normal(size=(N, D)) * np.linspace(0.5, 2.0, N)[:, None]
W = np.random.default_rng(1).dirichlet(np.ones(N))


def test_velocity_and_field_match_numpy():
    attn = CosineAttention(D, BETA)
    np.testing.assert_allclose(attn.velocity(X, W), numpy_cosine(X, W, BETA), rtol=1e-12)
    # a position-free attention has the field at arbitrary points: a query is one more token of mass 0
    q = np.random.default_rng(2).normal(size=(4, D))
    xq, wq = np.concatenate([X, q]), np.concatenate([W, np.full(4, 1e-300)])
    np.testing.assert_allclose(attn.field(q, X, W), numpy_cosine(xq, wq, BETA)[N:], rtol=1e-10)


@pytest.mark.parametrize("alibi, include_self", [(None, True), (0.8, True), (0.8, False)])
def test_causal_wraps_it(alibi, include_self):
    attn = tp.Causal(CosineAttention(D, BETA), alibi=alibi, include_self=include_self)
    expected = numpy_cosine(X, W, BETA, causal=True, alibi=alibi or 0.0, include_self=include_self)
    np.testing.assert_allclose(attn.velocity(X, W), expected, rtol=1e-12, atol=1e-15)
    # split over devices, the mask uses global positions: the same velocities
    np.testing.assert_allclose(tp.Sharded(attn).velocity(X, W), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("causal", [False, True])
def test_on_the_sphere_it_is_softmax_attention(causal):
    """On S^{d-1}, cos∠(x, y) = ⟨x, y⟩: the sphere dynamics and its solution are those of
    SoftmaxAttention with Q = K = V = I (the library's own kernel path), causal or not."""
    wrap = tp.Causal if causal else (lambda a: a)
    ours, theirs = wrap(CosineAttention(D, BETA)), wrap(tp.SoftmaxAttention.identity(D, BETA))
    x0 = tp.uniform_sphere(jax.random.key(3), N, D)
    a = tp.solve(tp.Sphere(ours), x0, t1=2.0, dt0=0.1, saveat=jnp.linspace(0.0, 2.0, 5))
    b = tp.solve(tp.Sphere(theirs), x0, t1=2.0, dt0=0.1, saveat=jnp.linspace(0.0, 2.0, 5))
    np.testing.assert_allclose(a.xs, b.xs, rtol=1e-11, atol=1e-12)
    assert float(jnp.max(jnp.abs(a.xs[-1] - x0))) > 1e-2  # the tokens moved
