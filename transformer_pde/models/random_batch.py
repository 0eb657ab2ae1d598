r"""Any attention, evaluated by the random batch method (Jin–Li–Liu 2020; issue 13).

``tp.RandomBatch(attn, batch_size=p, step=τ, key=key)`` is a dynamics like any other: wrap it in
:class:`~transformer_pde.Sphere` and integrate it with :func:`transformer_pde.solve` at
``dt0=τ``. The batches are redrawn at every step t_k = t0 + kτ (the step index is read from the
time); with ``diffrax.Euler()`` (the RBM of the paper) every step sees one partition. Higher-order
solvers evaluate stages at t_k + c τ; a stage at c = 1 already sees the next partition, so use
Euler for the rates of :mod:`transformer_pde.kernels.random_partition`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_in_range, check_int, check_key
from ..kernels.random_partition import random_batch_field
from .attention.base import AbstractAttention
from .attention.causal import Causal
from .base import AbstractDynamics

__all__ = ["RandomBatch"]


class RandomBatch(AbstractDynamics):
    """Random-batch evaluation of an attention's velocity: O(n p) per step.

    Args:
        attention: any attention (causal included; ALiBi position weights are not supported:
            their positions are global).
        batch_size: p >= 1, dividing the number of tokens.
        step: τ, the time step at which batches are redrawn (pass the same ``dt0`` to solve).
        key: PRNG key; batch k uses ``fold_in(key, k)``.
        t0: time of step 0.
    """

    attention: AbstractAttention
    key: jax.Array
    step: jax.Array
    t0: jax.Array
    batch_size: int = eqx.field(static=True)

    def __init__(self, attention, *, batch_size: int, step, key, t0=0.0):
        if not isinstance(attention, AbstractAttention):
            raise ValueError(f"RandomBatch wraps an attention (field at its own tokens), got "
                             f"{type(attention).__name__}")
        if isinstance(attention, Causal) and not (attention.alibi is None or isinstance(
                attention.alibi, jax.core.Tracer) or float(attention.alibi) == 0.0):
            raise ValueError("RandomBatch does not support ALiBi position weights (alibi != 0): "
                             "their positions are global, a batch's are not")
        check_key(key, "RandomBatch.key")
        # checked under jit too: a step of 0 would make every time step index infinite
        step = check_in_range(step, "RandomBatch.step", low=0.0, low_open=True)
        t0 = check_in_range(t0, "RandomBatch.t0")
        self.attention = attention
        self.batch_size = check_int(batch_size, "RandomBatch.batch_size", minimum=1)
        self.step = jnp.asarray(step)
        self.t0 = jnp.asarray(t0)
        self.key = key

    @property
    def dim(self):
        return self.attention.dim

    def vector_field(self, x, weights, t):
        # the step index, exact in the time's float type, folded in as two 32-bit words: past 2^31
        # steps an int32 index would saturate and every step reuse one partition. Below 2^32 the
        # high word is 0 and not folded (the same batches as a single fold of k).
        k = jnp.floor((t - self.t0) / self.step + 1e-6)
        high = jnp.floor(k / 2.0**32)
        low = (k - high * 2.0**32).astype(jnp.uint32)
        key = jax.random.fold_in(self.key, low)
        key = jax.lax.cond(high > 0, lambda: jax.random.fold_in(key, high.astype(jnp.uint32)), lambda: key)
        return random_batch_field(lambda q, y, w, r: self.attention.query_field(q, y, w, t, query_offset=r),
                                  x, weights, key, self.batch_size)
