r"""The token axis split over devices and hosts (jax.sharding + ``jax.shard_map``).

The velocity of token i, $\Gamma_\mu(x_i)$, needs every key $x_j$ but only its own query
(docs: math/attention.md#conventions). With $D$ devices each device owns $n/D$ tokens (its queries) and
evaluates its own shard (:meth:`~transformer_pde.models.AbstractAttention.shard_field`): an
attention made of kernel reductions hands them to its backend with this device's keys
(:class:`~transformer_pde.kernels.Exact` all-gathers the keys' projections and values, $O(n\,d)$
numbers, and runs the streaming kernel for its own query rows against all keys); any other
attention, and every causal one, gathers the tokens and weights first. Work and the
$O(\text{block}\cdot n/D)$ kernel memory are split $D$ ways; the result is the same as on one
device up to the order of floating-point sums. Everything else in a solve (the diffrax step,
retractions, statistics) is elementwise over tokens and stays sharded.

With the fast kernel (an attention with ``backend=tp.kernels.Fast(...)``, or ``Auto`` where it
picks the fast path) nothing of size n is gathered: each device spreads its own tokens onto the
Fourier modes (a type-1 NUFFT), the mode arrays are summed across devices (one all-reduce of M
numbers, independent of n, plus a few scalars), and each device evaluates the modes at its own
tokens (type 2): ``fast_lse_average_with_info(..., axis_name=)`` of the NUFFT module of
:mod:`transformer_pde.kernels`. Same numbers as one device up to the order of the sums.

Multi-host: the same code runs under JAX's multi-controller runtime. Call
``jax.distributed.initialize(...)`` in every process, build the mesh over ``jax.devices()``
(all hosts' devices) and the token array with :func:`shard_tokens`; see
``benchmarks/README.md`` ("Devices and hosts").
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .attention.base import AbstractAttention
from .base import AbstractDynamics

TOKENS = "tokens"


def token_mesh(devices=None, axis: str = TOKENS) -> Mesh:
    """A one-dimensional mesh over ``devices`` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (axis,))


def shard_tokens(x, mesh: Mesh, axis: str = TOKENS):
    """Place tokens (rows of ``x``, or a ``(n,)`` weight vector) split over ``mesh``'s axis.

    In a single process ``x`` is the whole array. Under ``jax.distributed`` (several
    processes) ``x`` is this process's contiguous slice of rows, in process order, and the
    result is the global array.
    """
    sharding = NamedSharding(mesh, PartitionSpec(axis))
    shards = int(mesh.shape[axis])
    n = int(np.shape(x)[0]) * (max(1, jax.process_count()))
    if n % shards:
        raise ValueError(f"shard_tokens: {n} tokens do not split evenly over {shards} devices; "
                         "pass the unsharded array to Sharded (it pads internally) or choose n "
                         f"divisible by {shards}")
    if jax.process_count() == 1:
        return jax.device_put(jnp.asarray(x), sharding)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))


class Sharded(AbstractDynamics):
    r"""Run an attention dynamics with the token axis split over a device mesh.

    ``tp.Sharded(attn)`` is a dynamics like any other: pass it to :func:`transformer_pde.solve`,
    wrap it in :class:`transformer_pde.Sphere`, evaluate ``.velocity(x)``. Inside, each device
    evaluates the field $\Gamma_\mu$ at its own tokens against the measure of every device's
    tokens $\mu=\sum_j w_j\delta_{x_j}$ (``AbstractAttention.shard_field``). When n is not a
    multiple of the number of devices, the tokens are padded with zero-weight copies at the end
    (they contribute nothing, and causal positions are those of the n tokens) and the padding is
    dropped from the result.

    Args:
        dynamics: an attention variant. Causal variants get each shard's global position
            (query i of shard r is token r n/D + i), so the mask is the one-device mask.
        mesh: device mesh; default :func:`token_mesh` over all devices.
        axis: the mesh axis the tokens are split over.
    """

    dynamics: AbstractAttention
    mesh: Mesh = eqx.field(static=True)
    axis: str = eqx.field(static=True)

    def __init__(self, dynamics, mesh: Mesh | None = None, axis: str = TOKENS):
        if not isinstance(dynamics, AbstractAttention):
            raise ValueError("Sharded.dynamics must be an attention variant such as SoftmaxAttention "
                             "(Sharded splits the queries of an attention field Γ_μ), got "
                             f"{type(dynamics).__name__}")
        if not isinstance(axis, str):
            raise ValueError(f"Sharded.axis must be the name of a mesh axis (a str), got {axis!r}")
        if mesh is not None and not isinstance(mesh, Mesh):
            raise ValueError(f"Sharded.mesh must be a jax.sharding.Mesh (or None: tp.sharding.token_mesh()), "
                             f"got {type(mesh).__name__}")
        mesh = token_mesh(axis=axis) if mesh is None else mesh
        if axis not in mesh.axis_names:
            raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
        self.dynamics, self.mesh, self.axis = dynamics, mesh, axis

    @property
    def dim(self):
        return self.dynamics.dim

    @property
    def num_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    def vector_field(self, x, weights, t):
        n = x.shape[0]
        pad = -n % self.num_shards
        if pad:
            x = jnp.concatenate([x, jnp.zeros((pad, x.shape[1]), x.dtype)])
            weights = jnp.concatenate([weights, jnp.zeros((pad,), weights.dtype)])
        arrays, static = eqx.partition(self.dynamics, eqx.is_array)
        tok, rep = PartitionSpec(self.axis), PartitionSpec()

        def local(arrays, t, x_local, w_local):
            # the attention evaluates its own shard (AbstractAttention.shard_field); padding
            # tokens come last, so causal tokens never see them
            return eqx.combine(arrays, static).shard_field(x_local, w_local, t, self.axis, n)

        specs = (jax.tree.map(lambda _: rep, arrays), rep, tok, tok)
        # check_vma=False: the kernels start loop carries from fresh zeros (replicated type)
        # while the queries vary per shard; the values are right, only the type check objects
        out = jax.shard_map(local, mesh=self.mesh, in_specs=specs, out_specs=tok,
                            check_vma=False)(
            arrays, jnp.asarray(t, x.dtype), x, weights)
        return out[:n] if pad else out


__all__ = ["Sharded", "shard_tokens", "token_mesh"]
