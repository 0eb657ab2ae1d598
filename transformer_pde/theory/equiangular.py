r"""Equiangular starts and their reduced ODE for the common inner product (docs: math/sphere.md#equiangular-starts).

If the Gram matrix of the start is equiangular, ⟨x_i, x_j⟩ = ρ0 for all i ≠ j, symmetry keeps
it equiangular and ρ(t) solves (GLPR `thm: orthogonal`)

$$\text{SA: }\dot\rho=\frac{2e^{\beta\rho}(1-\rho)((n-1)\rho+1)}{e^\beta+(n-1)e^{\beta\rho}},\qquad
\text{USA: }\dot\rho=\tfrac2n e^{\beta\rho}(1-\rho)((n-1)\rho+1).$$
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_count, check_in_range, check_real, check_scalar, is_concrete
from ..solvers import AbstractODE, solve


def equiangular_start(key, n: int, d: int, rho0: float, dtype=None):
    """n unit vectors in R^d with ⟨x_i, x_j⟩ = rho0 (i ≠ j), randomly rotated.

    Rows of the symmetric square root of G = (1 − ρ0) I + ρ0 11ᵀ (positive semi-definite
    iff ρ0 >= −1/(n−1)), padded to d columns and rotated by a random orthogonal matrix.
    """
    n = check_count(n, "n", minimum=1)
    d = check_count(d, "d", minimum=n)
    check_in_range(rho0, "rho0", low=-1 / (n - 1) if n > 1 else -1.0, high=1.0,
                   meaning="a common inner product of n unit vectors")
    dtype = dtype or jnp.result_type(float)
    G = (1 - rho0) * np.eye(n) + rho0 * np.ones((n, n))
    lam, U = np.linalg.eigh(G)
    X = (U * np.sqrt(np.clip(lam, 0, None))) @ U.T
    X = np.concatenate([X, np.zeros((n, d - n))], axis=1)
    R, _ = np.linalg.qr(np.asarray(jax.random.normal(key, (d, d)), dtype=np.float64))
    X = X @ R
    return jnp.asarray(X / np.linalg.norm(X, axis=1, keepdims=True), dtype)


class AbstractReducedODE(AbstractODE):
    r"""The gap u = 1 − ρ of an equiangular start, u' = −ρ'(1 − u) (relative accuracy in the gap,
    however small it gets); subclasses give ρ' (GLPR `thm: orthogonal`, docs: math/sphere.md#equiangular-starts)."""

    n: eqx.AbstractVar[int]
    beta: eqx.AbstractVar[jax.Array]

    def __check_init__(self):
        check_count(self.n, "n", minimum=1)
        if is_concrete(self.beta):  # a traced β is the caller's (checked where it was made)
            check_scalar(self.beta, "beta")

    @abc.abstractmethod
    def rho_rate(self, rho):
        """dρ/dt at the common inner product ρ."""

    def rhs(self, t, u):
        return -self.rho_rate(1 - u)


class SAReducedODE(AbstractReducedODE):
    r"""SA: $\dot\rho = 2e^{\beta\rho}(1-\rho)((n-1)\rho+1)/(e^\beta+(n-1)e^{\beta\rho})$."""

    n: int = eqx.field(static=True)
    beta: jax.Array

    def rho_rate(self, rho):
        b, n = self.beta, self.n
        return 2 * jnp.exp(b * rho) * (1 - rho) * ((n - 1) * rho + 1) / (jnp.exp(b) + (n - 1) * jnp.exp(b * rho))


class USAReducedODE(AbstractReducedODE):
    r"""USA: $\dot\rho = \tfrac2n e^{\beta\rho}(1-\rho)((n-1)\rho+1)$."""

    n: int = eqx.field(static=True)
    beta: jax.Array

    def rho_rate(self, rho):
        return 2 / self.n * jnp.exp(self.beta * rho) * (1 - rho) * ((self.n - 1) * rho + 1)


@eqx.filter_jit
def reduced_gap(ode: AbstractReducedODE, rho0, ts, controller):
    """The gap 1 − ρ(t) of ``ode`` at the times ``ts`` (adaptive steps by ``controller``)."""
    if not isinstance(ode, AbstractReducedODE):
        raise ValueError(f"ode must be a reduced ODE such as SAReducedODE(n, beta), got {type(ode).__name__}")
    rho0 = check_in_range(rho0, "rho0", low=-1 / (ode.n - 1) if ode.n > 1 else -1.0, high=1.0,
                          meaning="a common inner product of n unit vectors")
    if jnp.ndim(ts) != 1 or jnp.shape(ts)[0] < 2:
        raise ValueError(f"ts must be a vector of at least 2 times, got shape {jnp.shape(ts)}")
    ts = check_real(ts, "ts")
    if is_concrete(ts) and not np.all(np.diff(np.asarray(ts)) > 0):
        raise ValueError(f"ts must be strictly increasing, got {np.asarray(ts)!r}"[:300])
    return solve(ode, 1 - rho0, t0=ts[0], t1=ts[-1], dt0=1e-3, saveat=ts, stepsize_controller=controller,
                 max_steps=1_000_000).xs


__all__ = ["AbstractReducedODE", "SAReducedODE", "USAReducedODE", "equiangular_start", "reduced_gap"]
