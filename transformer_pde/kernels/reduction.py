r"""The softmax reduction an attention hands its kernel backend, as a value.

Every attention whose field is made of softmax averages (softmax, multi-head per head, ℓ², USA,
Sinkhorn) describes each of them as one :class:`SoftmaxReduction` of the logits

$$\ell_{ij}=\gamma\langle a_i,b_j\rangle+\mathrm{bias}_j,\qquad a_i=Q q_i,\ b_j=K x_j\in\mathbb R^k,$$

and its backend (:mod:`.backends`) returns ``(avg, lse)``, $\bar v_i=\sum_j\mathrm{softmax}_j(\ell_
{ij})v_j$ and $\log\sum_je^{\ell_{ij}}$, without the attention asking how. The Gaussian form
$(a, b, \gamma)$ is what the fast kernel needs; the exact kernel takes any factorization
$q_i\cdot k_j=\gamma\langle a_i,b_j\rangle$, and an attention may give it a cheaper one.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


class SoftmaxReduction(eqx.Module):
    """One softmax reduction: logits ``gamma * a_i·b_j + bias_j``, values ``v`` (module docstring).

    Attributes:
        a, b: query and key scores, shapes ``(m, k)`` and ``(n, k)``.
        v: values, ``(n, e)``.
        bias: key biases, ``(n,)`` (``log w_j``, ``-inf`` removes a key).
        gamma: the scalar γ.
        dtype: the tokens' dtype, in which the fast kernel runs (float32 tokens with float64
            parameters run the float32 plan); the exact kernel computes in the arrays' own
            (promoted) dtype.
        exact_scores: ``(q, k)`` with ``q_i·k_j = γ⟨a_i, b_j⟩``, a cheaper factorization for the
            exact kernel; None: ``(γ a, b)``.
        causal: query i sees keys j <= ``query_offset`` + i only (the exact kernel alone masks).
        query_offset: the position of query 0 among the keys (an int or a traced integer).
    """

    a: Float[Array, "m k"]
    b: Float[Array, "n k"]
    v: Float[Array, "n e"]
    bias: Float[Array, " n"]
    gamma: Float[Array, ""]
    dtype: np.dtype = eqx.field(static=True, converter=np.dtype)
    exact_scores: tuple[Array, Array] | None = None
    causal: bool = eqx.field(static=True, default=False)
    query_offset: int | jax.Array = 0

    @property
    def num_queries(self) -> int:
        return self.a.shape[0]

    @property
    def num_keys(self) -> int:
        return self.b.shape[0]

    @property
    def value_width(self) -> int:
        return self.v.shape[1]

    def exact_form(self):
        """``(q, k, v, bias)`` for :func:`.exact.lse_average`, in the arrays' own dtypes."""
        q, k = (self.gamma * self.a, self.b) if self.exact_scores is None else self.exact_scores
        return q, k, self.v, self.bias

    def gaussian_form(self):
        """``(a, b, v, bias, gamma)`` in the tokens' dtype, for the fast kernel."""
        return tuple(jnp.asarray(z).astype(self.dtype)
                     for z in (self.a, self.b, self.v, self.bias, self.gamma))


def gather_keys(axis_name, *arrays):
    """Every device's rows of ``arrays`` (inside ``shard_map`` over ``axis_name``); the arrays
    themselves when ``axis_name`` is None."""
    if axis_name is None:
        return arrays
    return tuple(jax.lax.all_gather(a, axis_name, tiled=True) for a in arrays)


def keys_over_devices(n: int, axis_name) -> int:
    """The number of keys over every device (``n`` per device inside ``shard_map``)."""
    return n if axis_name is None else n * jax.lax.axis_size(axis_name)


__all__ = ["SoftmaxReduction", "gather_keys", "keys_over_devices"]
