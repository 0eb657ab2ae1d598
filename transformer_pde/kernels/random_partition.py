r"""Random batch method (Jin–Li–Liu, J. Comput. Phys. 400, 2020): interactions inside random batches.

At each time step the n tokens are shuffled and cut into n/p batches of p; every token feels
only the measure of its own batch,

$$\mu^{(i)}=w_i\,\delta_{x_i}+(1-w_i)\sum_{j\in b(i),\,j\ne i}\frac{w_j}{\sum_{k\in b(i),\,k\ne i}w_k}\,
\delta_{x_j},\qquad \dot x_i=\Gamma_{\mu^{(i)}}(x_i),$$

so one velocity costs O(n p) instead of O(n²), for any attention and any d. The self term keeps
its exact mass w_i (Jin–Li–Liu sum over j ≠ i); the others share the rest. For uniform weights
every j ≠ i is equally likely to share i's batch, so E μ^{(i)} = μ: for attention linear in μ
(USA, sigmoid) the random field is unbiased and the RBM path stays within O(√τ) of the exact
particle path in mean square for time step τ (Jin–Li–Liu 2020, Thm 3.1; batches redrawn every
step). Normalized attention (softmax, ℓ², multi-head) is a ratio of two such averages, so its
random field carries a bias of the order of its variance, O(1/p): the RBM error then levels off
at that bias as τ → 0, and shrinks with the batch size. Both facts are measured in
``tests/kernels/test_random_batch.py``. Causal attention stays causal: each batch keeps its tokens in
their original order, so a token sees the earlier tokens of its batch.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def batch_indices(key, n: int, batch_size: int):
    """A random partition of range(n) into batches of ``batch_size``, each batch sorted (token
    order kept for causal attention): shape ``(n // batch_size, batch_size)``."""
    perm = jax.random.permutation(key, n).reshape(n // batch_size, batch_size)
    return jnp.sort(perm, axis=1)


def random_batch_field(field: Callable, x, weights, key, batch_size: int):
    """Γ_{μ^{(b(i))}}(x_i) for a random partition into batches (module docstring).

    Args:
        field: ``field(queries, keys, weights, query_offset) -> (m, d)``, the field of the
            measure Σ_j weights_j δ_{keys_j} at the queries, query i being token
            ``query_offset + i`` for a causal mask (called with one query at a time).
        x: tokens ``(n, d)``; n must be a multiple of ``batch_size``.
        weights: ``(n,)``.
        key: PRNG key of this step.
        batch_size: p.
    """
    n = x.shape[0]
    if n % batch_size:
        raise ValueError(f"random batches: batch_size={batch_size} must divide the number of tokens n={n}")
    idx = batch_indices(key, n, batch_size)
    xb, wb = x[idx], weights[idx]  # (n/p, p, d), (n/p, p)
    eye = jnp.eye(batch_size, dtype=bool)
    # per query i of a batch: its own mass w_i, the others share 1 - w_i (module docstring)
    others = jnp.where(eye[None], 0.0, wb[:, None, :])  # (n/p, p_query, p_key)
    total = jnp.sum(others, axis=-1, keepdims=True)
    share = (1.0 - wb)[..., None] / jnp.where(total > 0, total, 1.0)
    omega = jnp.where(eye[None], wb[:, :, None], others * share)
    if batch_size == 1:
        omega = jnp.ones_like(omega)

    def one_batch(xs, om):
        # query r of the batch against the batch's keys with its own weights; r is its position
        # in the (order-kept) batch, which is what a causal mask needs
        return jax.vmap(lambda q, w, r: field(q[None], xs, w, r)[0])(xs, om, jnp.arange(batch_size))

    vb = jax.vmap(one_batch)(xb, omega)
    return jnp.zeros_like(x).at[idx.reshape(-1)].set(vb.reshape(n, -1).astype(x.dtype))


__all__ = ["batch_indices", "random_batch_field"]
