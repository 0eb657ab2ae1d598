r"""Runs of the random Transformer (docs: math/random_heads.md#the-random-transformer-chain): the chain of layers
with fresh random heads, and one path of its common-noise SDE limit, both through :mod:`transformer_pde.solve`.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_scalar
from ..models.random_heads import CommonNoiseSDE, GaussianHeads, RandomHeadsField
from ..models.sphere import PostLN, UnitSphere, unchecked_normalize
from .layers import layers
from .retracted import Retracted

__all__ = ["chain", "diffusive_chain", "sde"]

def chain(key, heads: GaussianHeads, x0, num_layers: int, eta, num_heads: int = 1,
          save_every: int | None = None):
    r"""The random Transformer x ← N(x + (η/H) Σ_h B_{θ_h}(x)), fresh θ_h each layer.

    Returns the states after every ``save_every`` layers (default: only the last), with the
    input first, shape ``(num_saves, n, d)``.
    """
    num_layers, num_heads = int(num_layers), int(num_heads)
    save_every = num_layers if save_every is None else int(save_every)
    if num_layers < 1 or num_heads < 1 or num_layers % save_every:
        raise ValueError(f"need num_layers >= 1, num_heads >= 1 and save_every | num_layers; got "
                         f"{num_layers}, {num_heads}, {save_every}")
    x0 = jnp.asarray(x0)
    eta = jnp.asarray(eta, x0.dtype)
    field = RandomHeadsField(heads, jax.random.split(key, num_layers), eta, jnp.zeros((), x0.dtype),
                             num_heads)
    return layers(PostLN(field), x0, num_layers, eta, save_every=save_every).xs


def diffusive_chain(key, heads: GaussianHeads, x0, s1, num_layers: int, num_heads: int = 1,
                    save_every: int | None = None):
    """The chain in the diffusive clock: η = √(s1·H/(L σ²)), so L layers span s ∈ [0, s1]."""
    eta = float(np.sqrt(float(s1) * num_heads / (int(num_layers) * heads.sigma2)))
    return chain(key, heads, x0, num_layers, eta, num_heads, save_every)


def sde(key, heads: GaussianHeads, x0, s1, dt, *, num_nodes: int = 32, saveat=None):
    r"""One path of the diffusive limit (case (G)) with diffrax and a VirtualBrownianTree.

    Itô SDE in the diffusive clock s (module docstring), Euler–Maruyama with retraction onto
    the sphere after each step. The noise is common to all tokens: one d×d matrix Brownian
    motion per quadrature node A_q (``num_nodes`` nodes, drawn once per path from ρ*_A).
    ``saveat``: times in [0, s1] (default ``[s1]``). Returns states ``(T, n, d)``.
    """
    if heads.v_mean != 0:
        raise ValueError(f"the diffusive SDE is implemented for the Gaussian case v_mean = 0 (zero "
                         f"drift), got v_mean={heads.v_mean}")
    check_scalar(s1, "s1", positive=True)
    check_scalar(dt, "dt", positive=True)
    ts = jnp.asarray([s1] if saveat is None else saveat, dtype=jnp.asarray(x0).dtype)
    return _sde(key, heads, jnp.asarray(x0), jnp.asarray(s1, ts.dtype), jnp.asarray(dt, ts.dtype),
                int(num_nodes), ts, int(np.ceil(float(s1) / float(dt))) + 1)


@eqx.filter_jit
def _sde(key, heads, x0, s1, dt, num_nodes, ts, max_steps):
    kn, kb = jax.random.split(key)
    _, W, Wp = heads.sample(kn, (num_nodes,), x0.dtype)
    sde = CommonNoiseSDE(heads, W, Wp)
    bm = diffrax.VirtualBrownianTree(0.0, s1, tol=dt / 2, shape=(num_nodes, heads.d, heads.d), key=kb)
    terms = diffrax.MultiTerm(diffrax.ODETerm(sde.drift), diffrax.ControlTerm(sde.diffusion, bm))
    sol = diffrax.diffeqsolve(terms, Retracted(diffrax.Euler(), UnitSphere()), 0.0, s1, dt, x0,
                              saveat=diffrax.SaveAt(ts=ts, fn=lambda s, y, args: unchecked_normalize(y)),
                              adjoint=diffrax.RecursiveCheckpointAdjoint(), max_steps=max_steps)
    return sol.ys


