"""The random batch method (Jin–Li–Liu 2020; issue 13): exact for one batch, causal, and its
measured error rates: O(√τ) against the exact particle system for attention linear in μ, a
bias that shrinks with the batch size for normalized attention."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp

N, D, T = 16, 3, 0.5
X0 = tp.uniform_sphere(jax.random.key(0), N, D)
EULER = diffrax.Euler()


def rms_error(attn, batch_size, tau, num_keys=16):
    """sqrt(E mean_i |x_i^RBM(T) − x_i(T)|²) over independent batch sequences, same x0 and τ."""
    exact = tp.solve(tp.Sphere(attn), X0, t1=T, dt0=tau, solver=EULER).final

    def one(key):
        rbm = tp.Sphere(tp.RandomBatch(attn, batch_size=batch_size, step=tau, key=key))
        return jnp.mean(jnp.sum((tp.solve(rbm, X0, t1=T, dt0=tau, solver=EULER).final - exact) ** 2, -1))

    return float(jnp.sqrt(jnp.mean(jax.vmap(one)(jax.random.split(jax.random.key(1), num_keys)))))


@pytest.mark.slow
def test_one_batch_of_all_tokens_is_the_exact_field():
    for attn in (tp.SoftmaxAttention.identity(D, 2.0), tp.UnnormalizedAttention.identity(D, 1.0),
                 tp.L2Attention.identity(D, 0.5)):
        w = jnp.arange(1.0, N + 1) / (N * (N + 1) / 2)
        rbm = tp.RandomBatch(attn, batch_size=N, step=0.1, key=jax.random.key(3))
        np.testing.assert_allclose(rbm.velocity(X0, w), attn.velocity(X0, w), rtol=1e-12, atol=1e-14)


@pytest.mark.slow
def test_batch_field_is_unbiased_for_attention_linear_in_mu():
    """E over partitions of the USA batch field = the exact field (uniform weights)."""
    attn = tp.UnnormalizedAttention.identity(D, 1.0)
    keys = jax.random.split(jax.random.key(4), 4000)
    mean = jnp.mean(jax.vmap(lambda k: tp.RandomBatch(attn, batch_size=4, step=1.0, key=k).vector_field(
        X0, jnp.full(N, 1.0 / N), jnp.zeros(())))(keys), axis=0)
    exact = attn.velocity(X0)
    # Monte Carlo: 4000 partitions, per-entry spread ~0.3 -> standard error ~5e-3
    np.testing.assert_allclose(mean, exact, atol=0.03)


@pytest.mark.slow
def test_rbm_error_is_order_sqrt_tau_for_usa():
    taus = [1 / 8, 1 / 32, 1 / 128]
    errs = [rms_error(tp.UnnormalizedAttention.identity(D, 1.0), 2, tau) for tau in taus]
    slope = np.polyfit(np.log(taus), np.log(errs), 1)[0]
    assert 0.4 < slope < 0.6, (errs, slope)  # Jin–Li–Liu: O(√τ)


@pytest.mark.slow
def test_softmax_rbm_bias_shrinks_with_batch_size():
    sa = tp.SoftmaxAttention.identity(D, 1.0)
    small, large = rms_error(sa, 2, 1 / 128), rms_error(sa, 8, 1 / 128)
    assert large < 0.5 * small, (small, large)


@pytest.mark.slow
def test_causal_rbm_keeps_the_first_token_still():
    attn = tp.Causal(tp.SoftmaxAttention.identity(D, 1.0))
    rbm = tp.Sphere(tp.RandomBatch(attn, batch_size=4, step=0.1, key=jax.random.key(2)))
    sol = tp.solve(rbm, X0, t1=2.0, dt0=0.1, solver=EULER)
    np.testing.assert_allclose(sol.final[0], X0[0], atol=1e-14)  # token 1 sees only itself
    assert float(jnp.max(jnp.abs(sol.final[1:] - X0[1:]))) > 1e-3


@pytest.mark.parametrize("make, match", [
    (lambda: tp.RandomBatch(tp.Sphere(tp.SoftmaxAttention.identity(D)), batch_size=2, step=0.1,
                            key=jax.random.key(0)), "RandomBatch wraps an attention"),
    (lambda: tp.RandomBatch(tp.Causal(tp.SoftmaxAttention.identity(D), alibi=1.0), batch_size=2,
                            step=0.1, key=jax.random.key(0)), "ALiBi"),
    (lambda: tp.RandomBatch(tp.SoftmaxAttention.identity(D), batch_size=0, step=0.1,
                            key=jax.random.key(0)), "batch_size must be >= 1"),
    (lambda: tp.RandomBatch(tp.SoftmaxAttention.identity(D), batch_size=5, step=0.1,
                            key=jax.random.key(0)).velocity(X0), "batch_size=5 must divide .* n=16"),
    (lambda: tp.RandomBatch(tp.SoftmaxAttention.identity(D), batch_size=2, step=0.0,
                            key=jax.random.key(0)), "step must be > 0"),
])
def test_bad_random_batch_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
