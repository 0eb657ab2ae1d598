"""Numbers within their meaning (issue 25 causes 5, 6), models: counts are integers (never
truncated), a random batch's key is a key, its step is > 0 under jit too, and its step index
does not saturate past 2^31 steps."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp

ATTN = tp.SoftmaxAttention.identity(2, 1.0)


@pytest.mark.package_errors
def test_mixln_layers_must_be_an_integer():
    with pytest.raises(ValueError, match="num_layers must be an integer, got 10.7"):
        tp.MixLN.from_layers(ATTN, 10.7, 0.1)
    # ⌊αL⌋ = ⌊0.25 · 12⌋ = 3 Post-LN layers of step 0.1: τ = 0.3; 12.0 is the integer 12
    assert tp.MixLN.from_layers(ATTN, 12.0, 0.1).switch_time == pytest.approx(0.3)


@pytest.mark.package_errors
@pytest.mark.parametrize("key", [None, 0, np.array([1, 2])])
def test_random_batch_key_must_be_a_key(key):
    with pytest.raises(ValueError, match="RandomBatch.key must be a JAX random key"):
        tp.RandomBatch(ATTN, batch_size=2, step=0.1, key=key)


def test_random_batch_step_is_checked_under_jit():
    make = eqx.filter_jit(lambda s: tp.RandomBatch(ATTN, batch_size=2, step=s, key=jax.random.key(0)).step)
    assert float(make(jnp.asarray(0.1))) == pytest.approx(0.1)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"RandomBatch.step must be > 0"):
        make(jnp.asarray(0.0))


@pytest.mark.slow
def test_random_batch_step_index_past_2_31():
    """Steps k and k' = k + 2^32 (both past 2^31) draw different batches; below 2^32 the batches
    are those of fold_in(key, k), as before."""
    x = tp.uniform_sphere(jax.random.key(1), 8, 2)
    w = jnp.full(8, 1 / 8)
    key = jax.random.key(2)
    rb = tp.RandomBatch(ATTN, batch_size=2, step=1.0, key=key)
    v = lambda t: np.asarray(rb.vector_field(x, w, jnp.asarray(t, jnp.float64)))  # noqa: E731
    big = float(2**31 + 5)
    assert not np.allclose(v(big), v(big + 2.0**32))
    assert not np.allclose(v(big), v(big + 1.0))
    from transformer_pde.kernels.random_partition import random_batch_field

    ref = random_batch_field(lambda q, y, ww, r: ATTN.query_field(q, y, ww, 7.0, query_offset=r),
                             x, w, jax.random.fold_in(key, 7), 2)
    np.testing.assert_allclose(v(7.0), ref, rtol=1e-12)
