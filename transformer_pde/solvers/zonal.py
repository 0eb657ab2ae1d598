r"""The mean field on S^{d−1} for zonal densities, spectrally in Gegenbauer polynomials
(docs: math/noise.md#zonal-densities-on-the-sphere; spec sphere.md §14).

A density that depends only on u = cos ϑ = ⟨x, e⟩ (e a fixed axis) stays zonal under the
Fokker–Planck equation ∂_tρ = (σ²/2)Δρ − div(ρ∇Ψ[ρ]) of ``tp.Sphere(attention)`` with A = βKᵀQ = aI
and V = vI (SA: Ψ = v log(G_aρ)/a; USA: Ψ = v e^{−β·shift} G_aρ/a; G_aρ(x) = ∫e^{a⟨x,y⟩}ρ(y)dσ_d(y)).
Under the uniform probability σ_d, u has the law ∝ (1 − u²)^{(d−3)/2} du; ρ is held by its
coefficients in the orthonormal polynomials φ_l of that law (Gegenbauer C_l^{((d−2)/2)}, Legendre
for d = 3, Chebyshev for d = 2), φ_0 = 1, so a_0 is the mass. Δφ_l = −l(l+d−2)φ_l, and G_a is
diagonal with the Funk–Hecke eigenvalue c_l(a) = E[e^{au}φ_l(u)]/φ_l(1), computed here by Gauss
quadrature (the closed form of ``tp.theory.noisy_sphere.funk_hecke`` checks it in the tests).
The transport uses scalar products only, div(ρ∇Ψ) = ½[Δ(ρΨ) + ρΔΨ − ΨΔρ], on a Gauss–Jacobi
grid fine enough (the 3/2 rule) that USA's quadratic products are projected exactly: a
Galerkin scheme whose mass is conserved to round-off. The diffusion is diagonal: IMEX
(``KenCarp4``) with the implicit stages solved exactly by :class:`~.density.DiagonalSolve`.
``tp.solve_density`` checks the answer as it checks every density: against degree 2L and against
tightened steps, so both the spatial and the time-step error are seen.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_int, check_scalar, is_concrete, runtime_check
from ..models.attention.softmax import SoftmaxAttention
from .density import AbstractDensity, DiagonalSolve, sphere_attention

# ----------------------------------------------------------------------------- quadrature, basis

MAX_DEGREE = 2048
"""The largest degree a :class:`ZonalDensity` takes (its tables are dense: O(L²) memory, O(L³) to build)."""


def _recurrence(n: int, d: int) -> np.ndarray:
    """β_1..β_{n−1} of the monic three-term recurrence p_{k+1} = u p_k − β_k p_{k−1} of the law
    ∝ (1 − u²)^{(d−3)/2} (Gegenbauer λ = (d−2)/2; β_1 = E u² = 1/d)."""
    lam = (d - 2) / 2
    k = np.arange(2, n, dtype=np.float64)
    return np.concatenate([[1 / d], k * (k + 2 * lam - 1) / (4 * (k + lam) * (k + lam - 1))])[: max(n - 1, 0)]


@functools.lru_cache(maxsize=64)
def _rule(n: int, d: int):
    """n Gauss–Jacobi nodes and weights (summing to 1) of the law of u = ⟨x, e⟩ on S^{d−1}
    (Golub–Welsch)."""
    off = np.sqrt(_recurrence(n, d))
    u, vec = np.linalg.eigh(np.diag(off, 1) + np.diag(off, -1))
    w = vec[0] ** 2
    return u, w / w.sum()


def _basis(u: np.ndarray, degree: int, d: int) -> np.ndarray:
    """φ_0..φ_degree at u, ``(len(u), degree+1)``: orthonormal for the law of u, φ_0 = 1."""
    sb = np.sqrt(_recurrence(degree + 2, d))
    phi = np.zeros((u.size, degree + 1))
    phi[:, 0] = 1.0
    if degree >= 1:
        phi[:, 1] = u / sb[0]
    for k in range(1, degree):
        phi[:, k + 1] = (u * phi[:, k] - sb[k - 1] * phi[:, k - 1]) / sb[k]
    return phi


def nodes(degree: int, d: int) -> np.ndarray:
    """The degree+1 Gauss–Jacobi nodes u_j (increasing) at which :class:`ZonalDensity` takes values."""
    check_int(degree, "degree", minimum=1, maximum=MAX_DEGREE)
    check_int(d, "d", minimum=2)
    return _rule(degree + 1, d)[0]


def basis(u, degree: int, d: int) -> np.ndarray:
    """The orthonormal polynomials φ_0..φ_degree of the law of u = cos ϑ on S^{d−1} (∝ Gegenbauer
    C_l^{((d−2)/2)}, φ_0 = 1, E[φ_kφ_l] = δ_kl) at ``u`` ``(..., degree+1)``."""
    check_int(degree, "degree", minimum=0)
    check_int(d, "d", minimum=2)
    u = np.asarray(u, dtype=np.float64)
    return _basis(u.reshape(-1), degree, d).reshape(u.shape + (degree + 1,))


def _fine_size(degree: int) -> int:
    """Nodes that integrate degree 3L exactly (2n − 1 >= 3L): USA's products ρΨφ_l."""
    return (3 * degree + 2) // 2 + 1


@functools.lru_cache(maxsize=64)
def _tables(degree: int, d: int):
    """(Φ, w) on the fine grid: synthesis ρ = Φa, analysis a = Φᵀ(w ρ)."""
    u, w = _rule(_fine_size(degree), d)
    return u, _basis(u, degree, d), w


def funk_hecke_scaled(a, degree: int, d: int, nodes_: int | None = None):
    """e^{−a}c_l(a), l = 0..degree: the Funk–Hecke eigenvalues of G_a (∫e^{a⟨x,y⟩}φ_l(y)dσ_d(y)
    = c_l(a)φ_l(x)) by Gauss quadrature of E[e^{a(u−1)}φ_l(u)]/φ_l(1) (traceable in a)."""
    n = nodes_ or max(64, degree + 32)
    u, w = _rule(n, d)
    phi = _basis(u, degree, d)
    at1 = _basis(np.ones(1), degree, d)[0]
    a = jnp.asarray(a)
    return jnp.einsum("j,jl->l", jnp.asarray(w, a.dtype) * jnp.exp(a * (jnp.asarray(u, a.dtype) - 1)),
                      jnp.asarray(phi / at1, a.dtype))


# --------------------------------------------------------------------------------- the dynamics


def _zonal_attention(dynamics, d: int):
    """(attention, a, v) of ``tp.Sphere(attention)`` on S^{d−1} with A = aI, V = vI; ValueError
    naming what does not fit."""
    attn = sphere_attention(dynamics, "ZonalDensity", "zonal", d)
    A, V = attn.score_matrix(), attn.V
    if all(is_concrete(m) for m in (attn.Q, attn.K, attn.V, attn.beta)):
        eye = np.eye(d)
        for name, m in (("A = beta KᵀQ", np.asarray(A)), ("V", np.asarray(V))):
            if np.max(np.abs(m - m[0, 0] * eye)) > 1e-12 * max(1.0, np.max(np.abs(m))):
                raise ValueError(f"{name} = {m.tolist()} is not a multiple of the identity: the dynamics does not "
                                 "keep densities zonal (the zonal solver needs Q, K, V multiples of I)")
    return attn, A[0, 0], V[0, 0]


def _potential(dynamics, a, d: int):
    """Ψ[ρ] on the fine grid from the coefficients ``a`` (unchecked dynamics), and its coefficients."""
    degree = a.shape[-1] - 1
    attn, s, v = dynamics.dynamics, dynamics.dynamics.score_matrix()[0, 0], dynamics.dynamics.V[0, 0]
    _, phi, w = _tables(degree, d)
    phi, w = jnp.asarray(phi, a.dtype), jnp.asarray(w, a.dtype)
    g = funk_hecke_scaled(s.astype(a.dtype), degree, d) * a  # e^{−s}·coefficients of G_sρ
    if isinstance(attn, SoftmaxAttention):
        psi_grid = v * jnp.log(phi @ g) / s  # + v (a constant: no field)
        return psi_grid, phi.T @ (w * psi_grid)
    psi = v * jnp.exp(s - attn.beta * attn.shift) * g / s
    return phi @ psi, psi


def transport(dynamics, a, d: int):
    """The coefficients of −div(ρ∇Ψ[ρ]) = −½[Δ(ρΨ) + ρΔΨ − ΨΔρ] (degree <= L, Galerkin) for ρ with
    coefficients ``a`` ``(L+1,)`` on S^{d−1} (dynamics unchecked: see :class:`ZonalDensity`)."""
    degree = a.shape[-1] - 1
    _, phi, w = _tables(degree, d)
    phi, w = jnp.asarray(phi, a.dtype), jnp.asarray(w, a.dtype)
    lam = laplacian_eigenvalues(degree, d, a.dtype)
    psi_grid, psi = _potential(dynamics, a, d)
    rho = phi @ a
    cross = rho * (phi @ (lam * psi)) - psi_grid * (phi @ (lam * a))
    return -0.5 * (lam * (phi.T @ (w * rho * psi_grid)) + phi.T @ (w * cross))


def laplacian_eigenvalues(degree: int, d: int, dtype=None):
    """−l(l+d−2), l = 0..degree: Δφ_l on S^{d−1}."""
    l = jnp.arange(degree + 1, dtype=dtype or jnp.result_type(float))
    return -l * (l + d - 2)


class ZonalDensity(AbstractDensity):
    r"""A zonal density ρ(u), u = cos ϑ = ⟨x, e⟩, on S^{d−1} against the uniform probability σ_d,
    held by its coefficients a_0..a_L in the orthonormal polynomials φ_l of the law of u
    (:func:`basis`; a_0 = 1 is the mass), moving by the Fokker–Planck equation of
    ``tp.Sphere(attention)`` (A = βKᵀQ and V multiples of I, SA or USA) with independent noise σ:
    ∂_tρ = (σ²/2)Δρ − div(ρ∇Ψ[ρ]). ``tp.solve(tp.Sphere(attn), tp.ZonalDensity(...), ...)``
    saves the coefficients ``(T, L+1)``; :meth:`values` maps them to ρ(u).

    Args:
        rho: a function of u (with ``degree``), or its positive values at ``nodes(L, d)``
            (L + 1 >= 2 of them); normalized to mass 1. Non-positive, non-finite input is a ValueError.
        d: the dimension of the ambient space (S^{d−1}), d >= 2.
        sigma: the noise σ >= 0 of each token.
        degree: the polynomial degree L when ``rho`` is a function.

    Example:
        ```python
        import numpy as np, jax.numpy as jnp, transformer_pde as tp

        eye = jnp.eye(3)
        rho0 = tp.ZonalDensity(lambda u: 1 + 0.3 * u, d=3, sigma=1.0, degree=16)
        sol = tp.solve(tp.Sphere(tp.UnnormalizedAttention(eye, eye, 2.0 * eye, 3.0)), rho0, t1=1.0,
                       saveat=np.array([0.0, 1.0]))
        sol.xs.shape                                   # (2, 17): the coefficients at the saves
        ```
    """

    coeffs: jax.Array
    sigma: jax.Array
    d: int = eqx.field(static=True)

    def __init__(self, rho, d: int, sigma=0.0, *, degree: int | None = None):
        check_int(d, "ZonalDensity.d", minimum=2)
        if callable(rho):
            if degree is None:
                raise ValueError("ZonalDensity(function) needs degree=")
            check_int(degree, "ZonalDensity.degree", minimum=1, maximum=MAX_DEGREE)
            rho = rho(nodes(degree, d))
        elif degree is not None:
            raise ValueError("degree= is for a function; values at the nodes set the degree themselves")
        rho = as_float_array(rho, "ZonalDensity.rho")
        sigma = check_scalar(sigma, "ZonalDensity.sigma", nonnegative=True)
        if rho.ndim != 1 or not 2 <= rho.shape[0] <= MAX_DEGREE + 1:
            raise ValueError(f"ZonalDensity needs values at the L + 1 nodes nodes(L, d), 1 <= L <= {MAX_DEGREE}, "
                             f"got shape {rho.shape}")
        u, w = _rule(rho.shape[0], d)
        if is_concrete(rho):
            r = np.asarray(rho)
            if not np.all(np.isfinite(r)):
                raise ValueError("ZonalDensity: the density is not finite (NaN or inf at a node)")
            if np.min(r) <= 0:
                j = int(np.argmin(r))
                raise ValueError(f"ZonalDensity: the density must be positive, got {r[j]:.3g} at u = cos(theta) = "
                                 f"{u[j]:.4g}")
        else:
            rho = runtime_check(rho, ~(jnp.all(jnp.isfinite(rho)) & (jnp.min(rho) > 0)),
                                "ZonalDensity: the density must be finite and positive at the nodes")
        phi = jnp.asarray(_basis(u, rho.shape[0] - 1, d), rho.dtype)
        a = phi.T @ (jnp.asarray(w, rho.dtype) * rho)  # exact for degree <= L: Gauss with L + 1 nodes
        self.coeffs = a / a[0]
        self.sigma = jnp.asarray(sigma, self.coeffs.dtype)
        self.d = d

    @classmethod
    def from_coefficients(cls, coeffs, d: int, sigma=0.0) -> "ZonalDensity":
        """The density with coefficients ``coeffs`` (its values at the nodes must be positive)."""
        coeffs = as_float_array(coeffs, "ZonalDensity.coeffs")
        if coeffs.ndim != 1 or coeffs.shape[0] < 2:
            raise ValueError(f"ZonalDensity needs L + 1 >= 2 coefficients, got shape {coeffs.shape}")
        phi = jnp.asarray(_basis(nodes(coeffs.shape[0] - 1, d), coeffs.shape[0] - 1, d), coeffs.dtype)
        return cls(phi @ coeffs, d, sigma)

    @property
    def degree(self) -> int:
        return self.coeffs.shape[0] - 1

    def values(self, u, coeffs=None):
        """ρ(u) from the coefficients (the state's, or ``coeffs`` ``(..., L+1)`` such as saves)."""
        c = self.coeffs if coeffs is None else coeffs
        return jnp.einsum("...l,ul->...u", c, jnp.asarray(basis(np.ravel(u), c.shape[-1] - 1, self.d), c.dtype))

    @property
    def resolution(self) -> str:
        return f"degree {self.degree}"

    def refined(self):
        """The same density at degree 2L (its coefficients padded with zeros)."""
        return self.restart(jnp.concatenate([self.coeffs, jnp.zeros(self.degree, self.coeffs.dtype)]))

    def grid_values(self, saved, on):
        """ρ at the nodes ``nodes(on.degree, d)`` (those of ``on``'s values)."""
        return self.values(nodes(on.degree, self.d), saved)

    def masses(self, saved):
        return saved[..., 0]

    def order_parameter(self, saved):
        """⟨cos ϑ⟩ = ∫u ρ dσ_d (signed: the cluster's side of the axis), :func:`order_parameter`."""
        return order_parameter(saved, self.d)

    def restart(self, value):
        return eqx.tree_at(lambda s: s.coeffs, self, value)

    def prepare(self, dynamics):
        _zonal_attention(dynamics, self.d)
        return self

    @property
    def y(self):
        return self.coeffs

    def transport(self, dynamics, a):
        """The coefficients of −div(ρ∇Ψ[ρ])."""
        return transport(dynamics, a, self.d)

    def diffusion(self, a):
        """The coefficients of (σ²/2)Δρ."""
        return self.sigma**2 / 2 * laplacian_eigenvalues(a.shape[-1] - 1, self.d, a.dtype) * a

    def stage_solver(self):
        """The implicit stage's exact solve: the diffusion is diagonal in the coefficients."""
        return DiagonalSolve()


# ------------------------------------------------------------------------------ checked solves


def order_parameter(coeffs, d: int):
    """⟨cos ϑ⟩ = ∫u ρ dσ_d = a_1/√d (φ_1 = √d u), from coefficients ``(..., L+1)``."""
    return coeffs[..., 1] / np.sqrt(d)


__all__ = ["ZonalDensity", "basis", "funk_hecke_scaled", "laplacian_eigenvalues", "MAX_DEGREE", "nodes",
           "order_parameter", "transport"]
