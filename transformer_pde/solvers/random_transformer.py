r"""Runs of the random Transformer (docs: math/random_heads.md#the-random-transformer-chain): the chain of layers
with fresh random heads (``tp.layers``), and one path of its common-noise SDE limit (``tp.solve`` with
``tp.CommonNoise``).
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_count, check_scalar
from ..models.random_heads import CommonNoiseSDE, GaussianHeads, RandomHeadsField, RandomHeadsMeanField
from ..models.sphere import PostLN
from .brownian import BrownianTree
from .layers import layers
from .noise import CommonNoise
from .solve import solve

__all__ = ["chain", "diffusive_chain", "sde"]

def chain(key, heads: GaussianHeads, x0, num_layers: int, eta, num_heads: int = 1,
          save_every: int | None = None):
    r"""The random Transformer x ← N(x + (η/H) Σ_h B_{θ_h}(x)), fresh θ_h each layer.

    Returns the states after every ``save_every`` layers (default: only the last), with the
    input first, shape ``(num_saves, n, d)``. ``eta`` is a concrete number (the layer step).
    """
    num_layers, num_heads = int(num_layers), int(num_heads)
    save_every = num_layers if save_every is None else int(save_every)
    if num_layers < 1 or num_heads < 1 or num_layers % save_every:
        raise ValueError(f"need num_layers >= 1, num_heads >= 1 and save_every | num_layers; got "
                         f"{num_layers}, {num_heads}, {save_every}")
    x0 = jnp.asarray(x0)
    check_scalar(eta, "eta", positive=True)
    field = RandomHeadsField(heads, jax.random.split(key, num_layers), jnp.asarray(eta, x0.dtype),
                             jnp.zeros((), x0.dtype), num_heads)
    # the step as given (a number): layers counts its layers before the run, even under lax.map
    return layers(PostLN(field), x0, num_layers, eta, save_every=save_every).xs


def diffusive_chain(key, heads: GaussianHeads, x0, s1, num_layers: int, num_heads: int = 1,
                    save_every: int | None = None):
    """The chain in the diffusive clock: η = √(s1·H/(L σ²)), so L layers span s ∈ [0, s1]."""
    eta = float(np.sqrt(float(s1) * num_heads / (int(num_layers) * heads.sigma2)))
    return chain(key, heads, x0, num_layers, eta, num_heads, save_every)


def sde(key, heads: GaussianHeads, x0, s1, dt, *, num_nodes: int = 32, saveat=None):
    r"""One path of the diffusive limit (case (G)): ``tp.solve`` with common noise.

    Itô SDE in the diffusive clock s (:class:`~transformer_pde.CommonNoiseSDE`), Euler–Maruyama
    with retraction onto the sphere after each step (``tp.PostLN``). The noise is common to all
    tokens: one d×d matrix Brownian motion per quadrature node A_q (``num_nodes`` nodes, drawn
    once per path from ρ*_A), from a virtual Brownian tree of resolution dt/2.
    ``saveat``: times in [0, s1] (default ``[s1]``). Returns states ``(T, n, d)``.
    """
    if heads.v_mean != 0:
        raise ValueError(f"the diffusive SDE is implemented for the Gaussian case v_mean = 0 (zero "
                         f"drift), got v_mean={heads.v_mean}")
    check_scalar(s1, "s1", positive=True)
    check_scalar(dt, "dt", positive=True)
    num_nodes = check_count(num_nodes, "num_nodes", minimum=1)
    x0 = jnp.asarray(x0)
    ts = jnp.asarray([s1] if saveat is None else saveat, dtype=x0.dtype)
    kn, kb = jax.random.split(key)
    _, W, Wp = heads.sample(kn, (num_nodes,), x0.dtype)
    g = CommonNoiseSDE(heads, W, Wp)
    return solve(PostLN(RandomHeadsMeanField(g)), x0, t1=s1, dt0=dt, saveat=ts, solver=diffrax.Euler(),
                 noise=CommonNoise(g, path=BrownianTree()), key=kb).xs
