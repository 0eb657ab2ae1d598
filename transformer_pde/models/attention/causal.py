r"""Causal attention as a wrapper (docs: math/causal.md#causal-attention): ``tp.Causal(attention)``
masks any attention that can mask its keys by position (:class:`AbstractMaskableAttention`), so
token i attends to tokens j <= i in their given order; ALiBi position weights are a key bias."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ..._checks import check_scalar
from ...kernels.backends import KernelReport
from ...params import scalar_param
from .base import AbstractAttention, AbstractKernelAttention, AbstractMaskableAttention, AbstractNormalizedAttention


class Causal(AbstractAttention):
    r"""``attention`` with token i attending to tokens j <= i in their given order (the CSA model
    for softmax attention; docs: math/causal.md#causal-attention):

    $$\dot x_i=\frac{\sum_{j\le i}w_je^{\beta\langle Qx_i,Kx_j\rangle-\lambda(i-j)/N}\,Vx_j}
    {\sum_{j\le i}w_je^{\beta\langle Qx_i,Kx_j\rangle-\lambda(i-j)/N}}\quad\text{(softmax)}.$$

    Args:
        attention: an :class:`AbstractMaskableAttention` (softmax, multi-head, ℓ², sigmoid,
            unnormalized; Sinkhorn's doubly stochastic weights have no causal form). Its kernel
            backend must compute masked reductions (``tp.kernels.Exact()`` or ``Auto``, which
            takes the exact kernel; not ``Fast``: a causal mask is not a convolution).
        alibi: λ >= 0, ALiBi-type position weights e^{−λ(i−j)/N}, or None (none). After the
            per-row constant e^{−λi/N} cancels in the normalization, a per-key bias +λj/N, so the
            model streams and shards like any causal attention; for a normalized attention only
            (:class:`AbstractNormalizedAttention`: softmax, ℓ², multi-head), where it cancels.
        include_self: False masks j < i (the lost-in-the-middle model): the first token then sees
            no key and does not move.

    Token weights are the masses of the causal measure (uniform: the authors' CSA). The field
    depends on positions: there is no field at arbitrary points and no Gaussian closure
    (:class:`AbstractMaskableAttention`). Sharded, every device's tokens are gathered
    (positions are global); in random batches (``tp.RandomBatch``) each batch keeps its order.
    """

    attention: AbstractMaskableAttention
    alibi: jax.Array | None
    include_self: bool = eqx.field(static=True)

    def __init__(self, attention, *, alibi=None, include_self: bool = True):
        if not isinstance(attention, AbstractMaskableAttention):
            raise ValueError("Causal wraps an attention that can mask its keys by position (an "
                             "AbstractMaskableAttention: softmax, multi-head, ℓ², sigmoid, unnormalized; "
                             f"wrap the causal one in Sphere or PostLN, not the reverse), got "
                             f"{type(attention).__name__}")
        name = f"Causal({type(attention).__name__})"
        if alibi is not None:
            alibi = scalar_param(check_scalar(alibi, f"{name}.alibi", nonnegative=True))
            if not isinstance(attention, AbstractNormalizedAttention):
                raise ValueError(f"{name}.alibi: ALiBi position weights are a key bias only where the "
                                 "row factor e^(-lambda i/N) cancels, in a normalized attention (softmax, "
                                 f"ℓ², multi-head); got {type(attention).__name__}")
        if isinstance(attention, AbstractKernelAttention):
            attention.backend.check_causal(name)
        self.attention = attention
        self.alibi = alibi
        self.include_self = bool(include_self)

    @property
    def dim(self):
        return self.attention.dim

    def query_field(self, queries, x, weights, t, query_offset=0):
        # ALiBi: e^{−λ(i−j)/N} = e^{−λi/N} e^{λj/N}; the first factor cancels in the normalization
        key_bias = None if self.alibi is None else self.alibi * jnp.arange(x.shape[0], dtype=x.dtype) / x.shape[0]
        # without itself, query i sees keys j <= i - 1
        offset = query_offset if self.include_self else query_offset - 1
        return self.attention.causal_field(queries, x, weights, t, offset, key_bias)

    def with_token_radius(self, r, who):
        inner = self.attention.with_token_radius(r, who)
        return self if inner is self.attention else eqx.tree_at(lambda c: c.attention, self, inner)

    def _kernel_attention(self) -> AbstractKernelAttention:
        if not isinstance(self.attention, AbstractKernelAttention):
            raise ValueError(f"Causal({type(self.attention).__name__}) hands no reduction to a kernel "
                             "backend: no kernel to report")
        return self.attention

    def kernel_choice(self, m: int, n: int, dtype) -> KernelReport:
        """The kernel the wrapped attention's backend takes, masked (always exact), and why."""
        return self._kernel_attention().kernel_choice(m, n, dtype, causal=True)

    def kernel_report(self, x, weights=None, t=0.0, queries=None) -> KernelReport:
        """The wrapped attention's :meth:`~AbstractKernelAttention.kernel_report`, masked."""
        return self._kernel_attention().kernel_report(x, weights, t, queries, causal=True)


__all__ = ["Causal"]
