r"""Pair reductions behind every attention variant: dense and streaming (blocked) paths.

All normalized attention variants (softmax, multi-head, ℓ², Sinkhorn, causal, weighted) are
one reduction (docs: math/attention.md#conventions; docs: math/fast_kernels.md#attention-as-a-gaussian-sum):

$$\bar v_i=\sum_j \mathrm{softmax}_j(q_i\cdot k_j+b_j)\,v_j,\qquad
\ell_i=\log\sum_j e^{q_i\cdot k_j+b_j},$$

with key biases $b_j=\log w_j$ (+ a Sinkhorn potential, $-\beta|Ky_j|^2$ for ℓ², ...). The
unnormalized variant is $e^{\ell_i}\bar v_i$, computed from the same pair; sigmoid
attention is $\sum_j\sigma(q_i\cdot k_j)\,w_jv_j$.

**Dense path** (small problems): the $m\times n$ logits are materialized, max-subtracted.

**Streaming path** (large problems): queries are visited in blocks of ``qb`` rows and keys in
blocks of ``kb`` rows, so extra memory is $O((m+n)(p+e) + qb\cdot kb)$, never $O(mn)$:

* Forward, single pass with a *fixed* per-query shift. Cauchy–Schwarz gives a safe upper
  bound on every logit, $c_i=|q_i|\max_j|k_j|+\max_j b_j\ge q_i\cdot k_j+b_j$, so
  $e^{q_i\cdot k_j+b_j-c_i}\le 1$ never overflows and no running maximum or rescaling is
  needed (the online log-sum-exp of flash attention, with its extra exponentials, is not
  needed). The shift and the bias ride along as extra columns,
  $[q_i,-c_i,1]\cdot[k_j,1,b_j]$, and the normalizer as a value column, $[v_j,1]$, so each
  pair costs one ``exp`` between two products, and each tile is one kernel that XLA:CPU fuses
  (no stored tile) and splits over the cores by query rows (:func:`_tile_sum`).
  The bound can be loose (general $Q,K$; large β); a row whose shifted sum falls below
  $\sqrt{\text{tiny}}$ (where flushed subnormals could matter) is recomputed exactly:
  its query block takes a second pass with the exact row maximum. The result is then
  the exact log-sum-exp to rounding in every case.
* Backward (``jax.custom_vjp``), flash-attention style with recomputation: with
  $P_{ij}=e^{s_{ij}-\ell_i}$, $D_i=\bar v_i\cdot\bar g_i$ for the output cotangent
  $\bar g$ and $\bar\ell$ for the log-normalizer's,
  $\partial s_{ij}=P_{ij}(\bar g_i\cdot v_j-D_i+\bar\ell_i)$; then
  $\bar q_i=\sum_j\partial s_{ij}k_j$, $\bar k_j=\sum_i\partial s_{ij}q_i$,
  $\bar b_j=\sum_i\partial s_{ij}$, $\bar v_j=\sum_iP_{ij}\bar g_i$, as two passes of row
  sums (queries as rows, then keys as rows). Memory stays linear in the number of tokens.
* Causal: only key blocks at or before the query block's last position are visited. Query i
  is token ``query_offset + i``, so one shard of the tokens is masked as on one device.

**Layouts.** How a reduction visits its pairs is a value (``layout=``): :class:`Dense`,
:class:`Streaming` (its key and query blocks), or :class:`DenseOrStreaming` (the default: dense up
to ``DENSE_MAX_PAIRS`` query-key pairs, streaming above).
"""

from __future__ import annotations

import abc
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import as_float_array, check_int, check_weights
from .platforms import current_platform

# Above this many query-key pairs (512 x 512) the automatic choice switches to the streaming
# path, which is faster from ~1000 tokens on (benchmarks/README.md) and memory-linear.
DENSE_MAX_PAIRS = 1 << 18
"""Query-key pairs (512 x 512) above which the automatic layout streams instead of going dense."""
# Key block (rows of keys per tile) and tile size (query rows x key rows) of the streaming
# path, measured fastest on a 2-core x86 CPU (benchmarks/README.md): XLA:CPU splits each tile's
# fused kernel over the cores by query rows, so narrow problems (d = 3) want tall tiles
# (16384 x 512); wide ones (d = 64) are matrix-product bound and want 4096 x 512, which stays
# in cache. The query block is the tile size // the key block.
DEFAULT_BLOCK = 512
DEFAULT_TILE = 1 << 23
WIDE_TILE = 1 << 21
# (query block, key block) of the default streaming tile on a GPU, measured on an H100
# (benchmarks/results/gpu/results.md, n = 65536 and 262144): 8192 x 4096 tiles run 13 % faster
# than the CPU's tiles at d = 3 and 38 % faster at d = 64, within 5 % of the best tile of a grid
# of eight at both widths; a tile stays a few hundred MiB, so memory remains linear in n.
GPU_BLOCKS = (8192, 4096)
# Values with at most this many columns (normalizer included, so d <= 15) use the broadcast
# tile form and the tall tile: measured faster up to d = 16, slower from d = 24 on.
NARROW = 16


def _causal_mask(m: int, n: int, q_offset=0, k_offset=0):
    qi = q_offset + jnp.arange(m)[:, None]
    kj = k_offset + jnp.arange(n)[None, :]
    return kj <= qi


def _safe(x, fill=0.0):
    """Replace -inf (a row that sees no key) by a finite value before subtracting it."""
    return jnp.where(jnp.isfinite(x), x, fill)


def log_weights(weights):
    """The key biases of a weighted measure, log w_j, with log 0 = -inf (zero-weight tokens are
    ignored, not NaN). ``weights``: shape ``(n,)``, finite, non-negative, summing to one (a
    ValueError naming them; traced, through ``eqx.error_if``)."""
    w = as_float_array(weights, "weights")
    if w.ndim != 1:
        raise ValueError(f"weights must have shape (n,), got shape {w.shape}")
    return unchecked_log_weights(check_weights(w, w.shape[0], w.dtype))


def unchecked_log_weights(weights):
    """:func:`log_weights` without its checks, for weights already checked (a state's weights, or
    one device's shard of them, which does not sum to one)."""
    return jnp.where(weights > 0, jnp.log(jnp.where(weights > 0, weights, 1.0)), -jnp.inf)


# ---------------------------------------------------------------------------------------------
# dense path


def _dense_weights(logits, causal, q0):
    """``(p, s, mx)``: the unnormalized softmax weights exp(logit - mx) of the last axis, their sums
    and the row maxima (both kept as an axis), the causal mask applied to the last two axes."""
    if causal:
        # the mask as a key bias (0 or -inf): an add, which XLA:CPU fuses into the logits'
        # product where a select was a pass of its own; the same weights for finite logits
        mask = jnp.where(_causal_mask(*logits.shape[-2:], q0), 0.0, -jnp.inf).astype(logits.dtype)
        logits = logits + mask.reshape((1,) * (logits.ndim - 2) + mask.shape)
    # a row that sees no key has max -inf: the dtype's lowest finite value stands in for it (its
    # weights are exp(-inf) = 0 all the same); jnp.maximum fuses where _safe's isfinite/where did not
    # (a third of the dense kernel's time at n = 64)
    mx = jnp.maximum(jnp.max(logits, axis=-1, keepdims=True), jnp.finfo(logits.dtype).min)
    p = jnp.exp(logits - mx)
    return p, jnp.sum(p, axis=-1, keepdims=True), mx


def _dense_lse_average(q, k, v, bias, causal, q0=0):
    p, s, mx = _dense_weights(q @ k.T + bias[None, :], causal, q0)
    return (p @ v) / jnp.where(s > 0, s, 1.0), (mx + jnp.log(s))[:, 0]


def _dense_head_sum(q, k, v, bias, causal, q0=0):
    # every head's weights normalized, summed over the heads, then applied to the shared values
    # once: one (m, n) x (n, e) product instead of one per head. Queries shared by the heads are
    # broadcast to one set per head: the product is then batched over the heads and comes out in
    # (head, query, key) order, where "mp,hnp->hmn" came out as (key, query) and was transposed (a
    # copy of the scores, and XLA:CPU fuses the batched product with the bias, max and exp that
    # follow: normalization's layers at the peers' settings, benchmarks/README.md)
    q = jnp.broadcast_to(q, (k.shape[0], *q.shape[-2:]))
    logits = jnp.einsum("hmp,hnp->hmn", q, k) + bias[None, None, :]
    p, s, _ = _dense_weights(logits, causal, q0)
    return jnp.sum(p / jnp.where(s > 0, s, 1.0), axis=0) @ v


def _dense_sigmoid(q, k, wv, causal, q0=0):
    s = jax.nn.sigmoid(q @ k.T)
    if causal:
        s = jnp.where(_causal_mask(q.shape[0], k.shape[0], q0), s, 0.0)
    return s @ wv


# ---------------------------------------------------------------------------------------------
# streaming path: shared plumbing


def _pad_rows(a, rows, value=0.0):
    pad = rows - a.shape[0]
    if pad == 0:
        return a
    return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), constant_values=value)


def _key_blocks_for(q_off, qb, kb, nk, causal):
    """Number of key blocks a query block starting at ``q_off`` must visit."""
    if not causal:
        return nk
    return jnp.minimum(nk, (q_off + qb + kb - 1) // kb)


def _first_query_block_for(k_off, q0, qb, causal):
    """First query block (query 0 at position ``q0``) that sees any key of the key block
    starting at ``k_off``."""
    return jnp.maximum(k_off - q0, 0) // qb if causal else 0


def _threshold(dtype) -> float:
    # Below sqrt(tiny), flushing subnormal terms to zero could change the sum's leading digits.
    return float(np.sqrt(np.finfo(np.dtype(dtype)).tiny))


# ---------------------------------------------------------------------------------------------
# streaming softmax: forward


def _tile_exp(qa, ka_blk, q_off, k_off, causal):
    p = jnp.exp(qa @ ka_blk.T)
    if causal:
        p = jnp.where(_causal_mask(qa.shape[0], ka_blk.shape[0], q_off, k_off), p, 0.0)
    return p


def _weighted_sum(p, v):
    """p @ v; for narrow v as a broadcast multiply-reduce, which XLA:CPU fuses with the
    producer of p into one multi-threaded kernel (at d = 3, as a product, it runs 1.8x slower;
    ``benchmarks/tile_forms.py``)."""
    if v.shape[1] <= NARROW:
        return jnp.sum(p[:, :, None] * v[None, :, :], axis=1)
    return p @ v


def _tile_sum(qa, ka_blk, va_blk, q_off, k_off, causal):
    """Σ_j exp(qa_i · ka_j) va_j over one tile, with qa = [q, -c, 1], ka = [k, 1, b], va = [v, 1]:
    one kernel that XLA:CPU fuses (no materialized tile) and splits over the cores by rows."""
    return _weighted_sum(_tile_exp(qa, ka_blk, q_off, k_off, causal), va_blk)


def _key_block(k, v, bias, j, kb):
    """Key block j as [k, 1, b] and [v, 1], sliced and augmented on the fly (no copy of all
    keys). The last block is clamped to end at n; keys it shares with block j - 1 get
    bias -inf so that no key is counted twice. Returns the block and its first key position."""
    n = k.shape[0]
    start = jnp.minimum(j * kb, n - kb)
    kblk = jax.lax.dynamic_slice_in_dim(k, start, kb)
    vblk = jax.lax.dynamic_slice_in_dim(v, start, kb)
    bblk = jax.lax.dynamic_slice_in_dim(bias, start, kb)
    bblk = jnp.where(start + jnp.arange(kb) >= j * kb, bblk, -jnp.inf)
    one = jnp.ones((kb, 1), k.dtype)
    return (jnp.concatenate([kblk, one, bblk[:, None]], axis=1),
            jnp.concatenate([vblk, one], axis=1), start)


def _sum_pass(qa, key_block, e, q_off, nk_vis, causal):
    """Σ_j exp(qa · [k_j, 1, b_j]) [v_j, 1] over the visible key blocks."""

    def body(j, acc):
        ka, va, start = key_block(j)
        return acc + _tile_sum(qa, ka, va, q_off, start, causal)

    acc0 = jnp.zeros((qa.shape[0], e + 1), qa.dtype)
    return jax.lax.fori_loop(0, nk_vis, body, acc0)


def _max_pass(q1, key_block, q_off, nk_vis, causal):
    """Exact row maxima of q_i · k_j + b_j (q1 = [q, 0, 1])."""

    def body(j, mx):
        ka, _, start = key_block(j)
        s = q1 @ ka.T
        if causal:
            s = jnp.where(_causal_mask(q1.shape[0], ka.shape[0], q_off, start), s, -jnp.inf)
        return jnp.maximum(mx, jnp.max(s, axis=-1))

    return jax.lax.fori_loop(0, nk_vis, body, jnp.full((q1.shape[0],), -jnp.inf, q1.dtype))


def _stream_fwd(q, k, v, bias, q0, causal, qb, kb):
    m, n = q.shape[0], k.shape[0]
    nq, nk = -(-m // qb), -(-n // kb)
    # Cauchy–Schwarz bound on every logit of row i
    kmax = jnp.max(jnp.sqrt(jnp.sum(k * k, axis=1)))
    bmax = _safe(jnp.max(bias))
    shift = jnp.sqrt(jnp.sum(q * q, axis=1)) * kmax + bmax
    qp = _pad_rows(q, nq * qb).reshape(nq, qb, -1)
    cp = _pad_rows(shift, nq * qb).reshape(nq, qb)
    tiny = _threshold(q.dtype)
    key_block = functools.partial(_key_block, k, v, bias, kb=kb)

    def one_query_block(args):
        qblk, cblk, i = args
        q_off = q0 + i * qb
        nk_vis = _key_blocks_for(q_off, qb, kb, nk, causal)
        ones = jnp.ones((qb, 1), q.dtype)

        def with_shift(c, trips):
            qa = jnp.concatenate([qblk, -c[:, None], ones], axis=1)
            return _sum_pass(qa, key_block, v.shape[1], q_off, trips, causal)

        acc = with_shift(cblk, nk_vis)
        # The bound was too loose for some row: redo this block with exact row maxima. The
        # redo's loops run 0 trips when no row needs it. (Not lax.cond: under vmap, for heads
        # and ensembles, it would run both branches; and not a 0-or-1-trip outer loop: XLA
        # hoists its loop-invariant body out and runs it always.)
        redo = jnp.any(acc[:, -1] < tiny)
        trips = jnp.where(redo, nk_vis, 0)
        mx = _safe(_max_pass(jnp.concatenate([qblk, 0 * ones, ones], 1), key_block, q_off,
                             trips, causal))
        c = jnp.where(redo, mx, cblk)
        acc = jnp.where(redo, with_shift(c, trips), acc)
        s = acc[:, -1]
        avg = acc[:, :-1] / jnp.where(s > 0, s, 1.0)[:, None]
        return avg, c + jnp.log(s)

    avg, lse = jax.lax.map(one_query_block, (qp, cp, jnp.arange(nq)))
    return avg.reshape(nq * qb, -1)[:m], lse.reshape(nq * qb)[:m]


# ---------------------------------------------------------------------------------------------
# streaming softmax: backward (flash-attention style, recomputing P tile by tile)


def _stream_bwd(q, k, v, bias, q0, out, lse, g_out, g_lse, causal, qb, kb):
    """Two passes, each a sum over tiles along rows (the form the forward pass runs at full
    speed): queries as rows for q̄, keys as rows for k̄, v̄, b̄. Each recomputes P: two ``exp``
    per pair, but every tile is one fused, multi-threaded kernel with no stored tile."""
    m, n = q.shape[0], k.shape[0]
    p_dim = q.shape[1]
    # one padding for both passes: rows in blocks of qb, columns in blocks of kb
    step = math.lcm(qb, kb)
    mp, np_ = -(-m // step) * step, -(-n // step) * step
    # P_ij = exp([q_i, -lse_i, 1] · [k_j, 1, b_j]); rows that see no key (lse = -inf), padded
    # rows (lse = +inf) and padded keys (b = -inf) give P = 0
    lse_p = _pad_rows(jnp.where(jnp.isfinite(lse), lse, jnp.inf), mp, jnp.inf)
    qa = jnp.concatenate([_pad_rows(q, mp), -lse_p[:, None], jnp.ones((mp, 1), q.dtype)], 1)
    # ∂s_ij = P_ij ([ḡ_i, ℓ̄_i − D_i] · [v_j, 1])
    dvec = jnp.sum(g_out * out, axis=1)
    ga = _pad_rows(jnp.concatenate([g_out, (g_lse - dvec)[:, None]], 1), mp)
    ka = jnp.concatenate([_pad_rows(k, np_), jnp.ones((np_, 1), k.dtype),
                          _pad_rows(bias, np_, -jnp.inf)[:, None]], 1)
    va = jnp.concatenate([_pad_rows(v, np_), jnp.ones((np_, 1), v.dtype)], 1)
    cols = lambda a, c: jax.lax.dynamic_slice_in_dim(a, c * kb, kb)

    def dq_rows(args):  # q̄_i = Σ_j ∂s_ij k_j
        qa_r, ga_r, r = args
        q_off = q0 + r * qb

        def body(c, acc):
            kc, vc = cols(ka, c), cols(va, c)
            ds = _tile_exp(qa_r, kc, q_off, c * kb, causal) * (ga_r @ vc.T)
            return acc + _weighted_sum(ds, kc[:, :p_dim])

        trips = _key_blocks_for(q_off, qb, kb, np_ // kb, causal)
        return jax.lax.fori_loop(0, trips, body, jnp.zeros((qb, p_dim), q.dtype))

    def dk_rows(args):  # [k̄_j, ·, b̄_j] = Σ_i ∂s_ij qa_i and v̄_j = Σ_i P_ij ḡ_i
        ka_r, va_r, r = args
        k_off = r * qb

        def body(c, acc):
            qc, gc = cols(qa, c), cols(ga, c)
            pt = jnp.exp(ka_r @ qc.T)
            if causal:
                pt = jnp.where(_causal_mask(kb, qb, q0 + c * kb, k_off).T, pt, 0.0)
            dst = pt * (va_r @ gc.T)
            return acc[0] + _weighted_sum(dst, qc), acc[1] + _weighted_sum(pt, gc[:, :-1])

        init = (jnp.zeros((qb, p_dim + 2), q.dtype), jnp.zeros((qb, v.shape[1]), q.dtype))
        return jax.lax.fori_loop(_first_query_block_for(k_off, q0, kb, causal), mp // kb, body,
                                 init)

    dq = jax.lax.map(dq_rows, (qa.reshape(-1, qb, p_dim + 2), ga.reshape(mp // qb, qb, -1),
                               jnp.arange(mp // qb)))
    dk, dv = jax.lax.map(dk_rows, (ka.reshape(-1, qb, p_dim + 2), va.reshape(np_ // qb, qb, -1),
                                   jnp.arange(np_ // qb)))
    dk = dk.reshape(np_, -1)[:n]
    # column p of [k, 1, b] multiplies -lse (not an input); column p + 1 is the bias
    return (dq.reshape(mp, -1)[:m], dk[:, :p_dim], dv.reshape(np_, -1)[:n], dk[:, p_dim + 1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _streaming_lse_average(q, k, v, bias, q0, causal, qb, kb):
    return _stream_fwd(q, k, v, bias, q0, causal, qb, kb)


def _streaming_fwd_rule(q, k, v, bias, q0, causal, qb, kb):
    out, lse = _stream_fwd(q, k, v, bias, q0, causal, qb, kb)
    return (out, lse), (q, k, v, bias, q0, out, lse)


def _streaming_bwd_rule(causal, qb, kb, res, cts):
    q, k, v, bias, q0, out, lse = res
    g_out, g_lse = cts
    dq, dk, dv, db = _stream_bwd(q, k, v, bias, q0, out, lse, g_out, g_lse, causal, qb, kb)
    # zero-weight keys have bias -inf: their gradient is 0 (P = 0), keep it that way
    db = jnp.where(jnp.isfinite(bias), db, 0.0)
    return dq, dk, dv, db.astype(bias.dtype), None


_streaming_lse_average.defvjp(_streaming_fwd_rule, _streaming_bwd_rule)


# ---------------------------------------------------------------------------------------------
# streaming sigmoid


def _sig_fwd(q, k, wv, q0, causal, qb, kb):
    m, n = q.shape[0], k.shape[0]
    nq, nk = -(-m // qb), -(-n // kb)
    kp = _pad_rows(k, nk * kb).reshape(nk, kb, -1)
    wvp = _pad_rows(wv, nk * kb).reshape(nk, kb, -1)  # padded keys carry zero weight
    qp = _pad_rows(q, nq * qb).reshape(nq, qb, -1)

    def one_query_block(args):
        qblk, i = args
        q_off = q0 + i * qb

        def body(j, acc):
            s = jax.nn.sigmoid(qblk @ kp[j].T)
            if causal:
                s = jnp.where(_causal_mask(qb, kb, q_off, j * kb), s, 0.0)
            return acc + _weighted_sum(s, wvp[j])

        acc0 = jnp.zeros((qb, wv.shape[1]), q.dtype)
        return jax.lax.fori_loop(0, _key_blocks_for(q_off, qb, kb, nk, causal), body, acc0)

    out = jax.lax.map(one_query_block, (qp, jnp.arange(nq)))
    return out.reshape(nq * qb, -1)[:m]


def _sig_bwd(q, k, wv, q0, g, causal, qb, kb):
    m, n = q.shape[0], k.shape[0]
    nq, nk = -(-m // qb), -(-n // kb)
    kp = _pad_rows(k, nk * kb).reshape(nk, kb, -1)
    wvp = _pad_rows(wv, nk * kb).reshape(nk, kb, -1)
    qp = _pad_rows(q, nq * qb).reshape(nq, qb, -1)
    gp = _pad_rows(g, nq * qb).reshape(nq, qb, -1)

    def one_key_block(dq, j):
        k_off = j * kb

        def body(i, carry):
            dq, dk, dwv = carry
            s = jax.nn.sigmoid(qp[i] @ kp[j].T)
            if causal:
                s = jnp.where(_causal_mask(qb, kb, q0 + i * qb, k_off), s, 0.0)
            ds = s * (1 - s) * (gp[i] @ wvp[j].T)
            return dq.at[i].add(ds @ kp[j]), dk + ds.T @ qp[i], dwv + s.T @ gp[i]

        init = (dq, jnp.zeros((kb, q.shape[1]), q.dtype), jnp.zeros((kb, wv.shape[1]), q.dtype))
        dq, dk, dwv = jax.lax.fori_loop(_first_query_block_for(k_off, q0, qb, causal), nq, body,
                                        init)
        return dq, (dk, dwv)

    dq, (dk, dwv) = jax.lax.scan(one_key_block, jnp.zeros_like(qp), jnp.arange(nk))
    return (dq.reshape(nq * qb, -1)[:m], dk.reshape(nk * kb, -1)[:n],
            dwv.reshape(nk * kb, -1)[:n], None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _streaming_sigmoid(q, k, wv, q0, causal, qb, kb):
    return _sig_fwd(q, k, wv, q0, causal, qb, kb)


_streaming_sigmoid.defvjp(
    lambda q, k, wv, q0, causal, qb, kb: (_sig_fwd(q, k, wv, q0, causal, qb, kb), (q, k, wv, q0)),
    lambda causal, qb, kb, res, g: _sig_bwd(*res[:3], res[3], g, causal, qb, kb),
)


# ---------------------------------------------------------------------------------------------
# public reductions


class AbstractLayout(eqx.Module):
    """How the exact kernel visits the m x n pairs of a reduction (a static strategy value)."""

    @abc.abstractmethod
    def blocks(self, m: int, n: int, width: int = 0) -> tuple[int, int] | None:
        """The streaming ``(query block, key block)`` for m queries, n keys and values of
        ``width`` columns, or None for the dense path."""


class Dense(AbstractLayout):
    """The m x n logits materialized and max-subtracted: fastest for small problems, O(mn)
    memory."""

    def blocks(self, m, n, width=0):
        return None


class Streaming(AbstractLayout):
    """Blocks of queries against blocks of keys: O((m + n)(p + e) + qb·kb) memory, never O(mn)
    (module docstring).

    Args:
        key_block: keys per block; None: tuned for the platform the reduction is traced for
            (``GPU_BLOCKS`` on a GPU, with its query block when that is None too;
            ``DEFAULT_BLOCK`` elsewhere).
        query_block: queries per block; None: the tile size divided by ``key_block``
            (``DEFAULT_TILE``, or ``WIDE_TILE`` when the values have more than ``NARROW`` columns).

    Blocks larger than the problem are clipped to it. The blocks change the order of the
    floating-point sums, not the sum: results agree to round-off across platforms.
    """

    key_block: int | None = eqx.field(static=True, default=None)
    query_block: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if self.key_block is not None:
            check_int(self.key_block, "Streaming.key_block", minimum=1)
        if self.query_block is not None:
            check_int(self.query_block, "Streaming.query_block", minimum=1)

    def blocks(self, m, n, width=0):
        kb, qb = self.key_block, self.query_block
        if kb is None:
            if current_platform() == "gpu":
                qb = GPU_BLOCKS[0] if qb is None else qb
                kb = GPU_BLOCKS[1]
            else:
                kb = DEFAULT_BLOCK
        kb = int(kb)
        if qb is None:
            qb = max(1, (WIDE_TILE if width + 1 > NARROW else DEFAULT_TILE) // kb)
        return min(int(qb), m), min(kb, n)


class DenseOrStreaming(AbstractLayout):
    """Dense up to ``max_dense_pairs`` query-key pairs, ``streaming`` above: the default, since
    the streaming path is faster from ~1000 tokens on (benchmarks/README.md) and memory-linear.
    ``max_dense_pairs=0`` always streams."""

    max_dense_pairs: int = eqx.field(static=True, default=DENSE_MAX_PAIRS)
    streaming: Streaming = eqx.field(static=True, default=Streaming())

    def __check_init__(self):
        check_int(self.max_dense_pairs, "DenseOrStreaming.max_dense_pairs", minimum=0)
        if not isinstance(self.streaming, Streaming):
            raise ValueError(f"DenseOrStreaming.streaming must be a Streaming layout, got "
                             f"{self.streaming!r}")

    def blocks(self, m, n, width=0):
        if m * n <= self.max_dense_pairs:
            return None
        return self.streaming.blocks(m, n, width)


DEFAULT_LAYOUT = DenseOrStreaming()
"""The layout every reduction takes unless told otherwise."""


def check_layout(layout, name: str = "layout") -> AbstractLayout:
    """``layout`` if it is an exact-kernel layout, else a ValueError naming it."""
    if not isinstance(layout, AbstractLayout):
        raise ValueError(f"{name} must be an exact-kernel layout (tp.kernels.Dense(), "
                         f"Streaming(key_block, query_block), DenseOrStreaming() or SpatialTiles(tiles)), got {layout!r}")
    return layout


def lse_average(
    q: Float[Array, "m p"],
    k: Float[Array, "n p"],
    v: Float[Array, "n e"],
    bias: Float[Array, " n"],
    *,
    causal: bool = False,
    query_offset=0,
    layout: AbstractLayout = DEFAULT_LAYOUT,
) -> tuple[Float[Array, "m e"], Float[Array, " m"]]:
    """Softmax-weighted average of values and the log-normalizer, for every query.

    Args:
        q, k: query and key features; the logit of pair (i, j) is ``q[i] @ k[j] + bias[j]``.
        v: values, one row per key.
        bias: key biases (``log w_j`` for weighted measures; ``-inf`` removes a key).
        causal: query i sees keys j <= query_offset + i only.
        query_offset: position of query 0 among the keys (an int or a traced integer scalar;
            a device's first global row when the queries are one shard of the tokens).
        layout: :class:`Dense`, :class:`Streaming` or :class:`DenseOrStreaming` (the default).

    Returns:
        ``(average, lse)`` with ``average[i] = Σ_j p_ij v_j`` and ``lse[i] = log Σ_j e^{logit_ij}``.
        A query that sees no key (every visible bias -inf) gets average 0 and lse -inf.
        Gradients are memory-linear on the streaming path (custom VJP with recomputation).
    """
    q0 = jnp.asarray(query_offset, jnp.int32)
    blocks = check_layout(layout).blocks(q.shape[0], k.shape[0], v.shape[1])
    if blocks is None:
        return _dense_lse_average(q, k, v, bias, causal, q0)
    dtype = jnp.result_type(q, k, v, bias)
    q, k, v, bias = (a.astype(dtype) for a in (q, k, v, bias))
    return _streaming_lse_average(q, k, v, bias, q0, bool(causal), *blocks)


def head_sum_average(
    q: Float[Array, "h m p"] | Float[Array, "m p"],
    k: Float[Array, "h n p"],
    v: Float[Array, "n e"],
    bias: Float[Array, " n"],
    *,
    causal: bool = False,
    query_offset=0,
    layout: AbstractLayout = DEFAULT_LAYOUT,
) -> Float[Array, "m e"]:
    """``Σ_h Σ_j softmax_j(q_hi·k_hj + bias_j) v_j``: H heads with their own logits averaging the
    same values, summed (multi-head attention whose heads share their value and output maps).

    Dense, the heads' softmax weights are summed before they meet the values (one m x n x e
    product instead of H); streaming, each head is one :func:`lse_average` and their averages
    are summed. Arguments as in :func:`lse_average`, with a leading head axis on ``k`` and on
    ``q`` unless the heads share their queries (``q`` of shape ``(m, p)``).
    """
    q0 = jnp.asarray(query_offset, jnp.int32)
    if check_layout(layout).blocks(q.shape[-2], k.shape[1], v.shape[1]) is None:
        return _dense_head_sum(q, k, v, bias, causal, q0)
    heads = jax.vmap(lambda qh, kh: lse_average(qh, kh, v, bias, causal=causal, query_offset=q0,
                                                 layout=layout)[0], in_axes=(0 if q.ndim == 3 else None, 0))
    return jnp.sum(heads(q, k), axis=0)


def softmax_average(q, k, v, bias, *, causal=False, query_offset=0, layout=DEFAULT_LAYOUT):
    """``Σ_j softmax_j(q_i·k_j + bias_j) v_j`` (see :func:`lse_average`)."""
    return lse_average(q, k, v, bias, causal=causal, query_offset=query_offset, layout=layout)[0]


def exp_kernel_sum(q, k, v, bias, *, causal=False, query_offset=0, layout=DEFAULT_LAYOUT):
    """``Σ_j exp(q_i·k_j + bias_j) v_j`` computed as ``exp(lse_i) · average_i``.

    The value is exact; it overflows only where the true sum exceeds the dtype's range.
    """
    avg, lse = lse_average(q, k, v, bias, causal=causal, query_offset=query_offset, layout=layout)
    return jnp.exp(lse)[:, None] * avg


def sigmoid_kernel_sum(q, k, v, weights, *, causal=False, query_offset=0,
                       layout=DEFAULT_LAYOUT):
    """``Σ_j w_j σ(q_i·k_j) v_j`` (bias folded into q·k by the caller), blocked over keys.

    ``causal`` and ``query_offset`` as in :func:`lse_average`. The streaming path has a custom
    VJP (recomputation), so gradients are memory-linear too.
    """
    q0 = jnp.asarray(query_offset, jnp.int32)
    wv = weights[:, None] * v
    blocks = check_layout(layout).blocks(q.shape[0], k.shape[0])
    if blocks is None:
        return _dense_sigmoid(q, k, wv, causal, q0)
    dtype = jnp.result_type(q, k, wv)
    return _streaming_sigmoid(q.astype(dtype), k.astype(dtype), wv.astype(dtype), q0,
                              bool(causal), *blocks)
