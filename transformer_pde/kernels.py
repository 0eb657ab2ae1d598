"""Pair reductions behind every attention variant: dense and streaming (blocked) paths.

All normalized attention variants (softmax, multi-head, L2, Sinkhorn, causal, weighted) are
one reduction (spec README, "Conventions"; euclidean.md §7):

    out_i = Σ_j softmax_j(q_i·k_j + b_j) v_j,        lse_i = log Σ_j exp(q_i·k_j + b_j),

with key biases b_j = log w_j (+ a Sinkhorn potential, − |K y_j|², ...). The unnormalized
variant is exp(lse_i) · out_i, computed from the same pair. The streaming path visits keys
in blocks with an online log-sum-exp, so extra memory is O(m · block) instead of O(m · n).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

# Above this many query-key pairs the automatic choice switches to the streaming path.
DENSE_MAX_PAIRS = 1 << 22
DEFAULT_BLOCK = 1024


def _causal_mask(m: int, n: int, q_offset=0, k_offset=0):
    qi = q_offset + jnp.arange(m)[:, None]
    kj = k_offset + jnp.arange(n)[None, :]
    return kj <= qi


def _dense_lse_average(q, k, v, bias, causal):
    logits = q @ k.T + bias[None, :]
    if causal:
        logits = jnp.where(_causal_mask(*logits.shape), logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)
    p = jnp.exp(logits - lse[:, None])
    return p @ v, lse


def _pad_to(a, size, axis, value=0.0):
    pad = size - a.shape[axis]
    if pad == 0:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, pad)
    return jnp.pad(a, widths, constant_values=value)


def _streaming_lse_average(q, k, v, bias, causal, block):
    """Online log-sum-exp over key blocks, queries processed block by block."""
    m, n = q.shape[0], k.shape[0]
    kb = min(block, n)
    nk = -(-n // kb)
    # padded keys get bias -inf so they never contribute
    k_p = _pad_to(k, nk * kb, 0).reshape(nk, kb, -1)
    v_p = _pad_to(v, nk * kb, 0).reshape(nk, kb, -1)
    b_p = _pad_to(bias, nk * kb, 0, -jnp.inf).reshape(nk, kb)

    qb = min(block, m)
    nq = -(-m // qb)
    q_p = _pad_to(q, nq * qb, 0).reshape(nq, qb, -1)

    def one_query_block(args):
        qblk, q_off = args

        def body(carry, kargs):
            acc, run_max, run_sum = carry
            kblk, vblk, bblk, k_off = kargs
            logits = qblk @ kblk.T + bblk[None, :]
            if causal:
                logits = jnp.where(_causal_mask(qb, kb, q_off, k_off), logits, -jnp.inf)
            blk_max = jnp.max(logits, axis=-1)
            new_max = jnp.maximum(run_max, blk_max)
            # guard rows that have seen only -inf so far (exp(-inf - -inf) would be NaN)
            safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
            scale = jnp.exp(run_max - safe_max)
            p = jnp.exp(logits - safe_max[:, None])
            acc = acc * scale[:, None] + p @ vblk
            run_sum = run_sum * scale + jnp.sum(p, axis=-1)
            return (acc, new_max, run_sum), None

        init = (jnp.zeros((qb, v.shape[1]), q.dtype), jnp.full((qb,), -jnp.inf, q.dtype),
                jnp.zeros((qb,), q.dtype))
        offsets = jnp.arange(nk) * kb
        (acc, run_max, run_sum), _ = jax.lax.scan(body, init, (k_p, v_p, b_p, offsets))
        safe_max = jnp.where(jnp.isfinite(run_max), run_max, 0.0)
        return acc / run_sum[:, None], safe_max + jnp.log(run_sum)

    out, lse = jax.lax.map(one_query_block, (q_p, jnp.arange(nq) * qb))
    return out.reshape(nq * qb, -1)[:m], lse.reshape(nq * qb)[:m]


def lse_average(
    q: Float[Array, "m p"],
    k: Float[Array, "n p"],
    v: Float[Array, "n e"],
    bias: Float[Array, " n"],
    *,
    causal: bool = False,
    block_size: int | None = None,
) -> tuple[Float[Array, "m e"], Float[Array, " m"]]:
    """Softmax-weighted average of values and the log-normalizer, for every query.

    Args:
        q, k: query and key features; the logit of pair (i, j) is ``q[i] @ k[j] + bias[j]``.
        v: values, one row per key.
        bias: key biases (``log w_j`` for weighted measures; ``-inf`` removes a key).
        causal: query i sees keys j <= i only (requires m <= n, queries aligned with keys).
        block_size: ``None`` picks dense below ``DENSE_MAX_PAIRS`` pairs and streaming above;
            ``0`` forces dense; a positive integer forces streaming with that block size.

    Returns:
        ``(average, lse)`` with ``average[i] = Σ_j p_ij v_j`` and ``lse[i] = log Σ_j e^{logit_ij}``.
    """
    m, n = q.shape[0], k.shape[0]
    if block_size is None:
        block_size = 0 if m * n <= DENSE_MAX_PAIRS else DEFAULT_BLOCK
    if block_size == 0:
        return _dense_lse_average(q, k, v, bias, causal)
    return _streaming_lse_average(q, k, v, bias, causal, int(block_size))


def softmax_average(q, k, v, bias, *, causal=False, block_size=None):
    """``Σ_j softmax_j(q_i·k_j + bias_j) v_j`` (see :func:`lse_average`)."""
    return lse_average(q, k, v, bias, causal=causal, block_size=block_size)[0]


def exp_kernel_sum(q, k, v, bias, *, causal=False, block_size=None):
    """``Σ_j exp(q_i·k_j + bias_j) v_j`` computed as ``exp(lse_i) · average_i``.

    The value is exact; it overflows only where the true sum exceeds the dtype's range.
    """
    avg, lse = lse_average(q, k, v, bias, causal=causal, block_size=block_size)
    return jnp.exp(lse)[:, None] * avg


def sigmoid_kernel_sum(q, k, v, weights, *, causal=False, block_size=None):
    """``Σ_j w_j σ(q_i·k_j) v_j`` (bias folded into q·k by the caller), blocked over keys."""
    m, n = q.shape[0], k.shape[0]
    if block_size is None:
        block_size = 0 if m * n <= DENSE_MAX_PAIRS else DEFAULT_BLOCK
    wv = weights[:, None] * v
    if block_size == 0:
        s = jax.nn.sigmoid(q @ k.T)
        if causal:
            s = jnp.where(_causal_mask(m, n), s, 0.0)
        return s @ wv
    kb = min(int(block_size), n)
    nk = -(-n // kb)
    k_p = _pad_to(k, nk * kb, 0).reshape(nk, kb, -1)
    wv_p = _pad_to(wv, nk * kb, 0).reshape(nk, kb, -1)  # padded keys carry zero weight

    def body(acc, kargs):
        kblk, wvblk, off = kargs
        s = jax.nn.sigmoid(q @ kblk.T)
        if causal:
            s = jnp.where(_causal_mask(m, kb, 0, off), s, 0.0)
        return acc + s @ wvblk, None

    acc, _ = jax.lax.scan(body, jnp.zeros((m, v.shape[1]), q.dtype), (k_p, wv_p, jnp.arange(nk) * kb))
    return acc
