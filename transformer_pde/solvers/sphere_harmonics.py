r"""Spherical harmonics on S² by an FFT in longitude and a Legendre table in latitude
(docs: math/noise.md#spectral-solver-on-the-sphere).

Convention: x = (sin ϑ cos φ, sin ϑ sin φ, cos ϑ), u = cos ϑ, and

    Y_lm(x) = p_l^m(u) e^{imφ},  0 <= m <= l,   Y_{l,−m} = conj(Y_lm),

with p_l^m the associated Legendre functions normalized so that ∫_{−1}^{1} (p_l^m)² du/2 = 1 (no
Condon–Shortley phase): the Y_lm are orthonormal in L²(σ), σ the uniform probability on S², and
Y_00 = 1. A real function is held by its coefficients c_lm = ∫ f conj(Y_lm) dσ for m >= 0, a
complex array ``(L+1, L+1)`` indexed ``[l, m]`` (zero where m > l); c_{l,−m} = conj(c_lm). A
density against σ has c_00 = its mass. A measure μ has μ̂_lm = ∫ conj(Y_lm) dμ
(:func:`empirical_coefficients` for Σ_i w_i δ_{x_i}).

Grids are Gauss–Legendre in u (``nlat`` nodes) times ``nlon`` equispaced longitudes φ_k = 2πk/nlon;
:func:`grid_shape` gives the 3/2 grid of degree L (nlat = ⌊3L/2⌋ + 1, nlon = 2·nlat), on which the
coefficients up to L of a product of two functions of degree L are computed exactly (no aliasing).
The table p_l^m(u_j) is computed once per grid in float64 by the standard three-term recurrence in
l at fixed m (stable), then cast to the working dtype.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_int, is_concrete


def _legendre(u, degree: int, xp):
    """p_l^m(u) for 0 <= m, l <= degree: array ``(degree+1 [m], degree+1 [l], *u.shape)``, zero
    where l < m; ``xp`` is numpy (the float64 tables) or jax.numpy (points, traced)."""
    L = degree
    m = np.arange(L + 1, dtype=np.float64)
    s = xp.sqrt(xp.clip(1 - u * u, 0.0, None))
    # sectoral p_m^m = Π_{k<=m} sqrt((2k+1)/(2k)) · s^m, by a cumulative product over m
    fac = np.sqrt((2 * m[1:] + 1) / (2 * m[1:]))
    shape = (L,) + (1,) * u.ndim
    steps = fac.reshape(shape) * s[None]
    sect = xp.concatenate([xp.ones((1,) + u.shape, dtype=u.dtype), xp.cumprod(steps, axis=0)], 0)
    rows = []  # rows[l][m] = p_l^m(u)
    for l in range(L + 1):
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(m < l, np.sqrt((4.0 * l * l - 1) / np.maximum(l * l - m * m, 1)), 0.0)
            b = np.where(m < l - 1, np.sqrt(((l - 1.0) ** 2 - m * m) / np.maximum(4.0 * (l - 1) ** 2 - 1, 1)), 0.0)
        a, b = a.reshape((-1,) + (1,) * u.ndim), b.reshape((-1,) + (1,) * u.ndim)
        prev = rows[l - 1] if l >= 1 else xp.zeros_like(sect)
        prev2 = rows[l - 2] if l >= 2 else xp.zeros_like(sect)
        onto = (np.arange(L + 1) == l).reshape((-1,) + (1,) * u.ndim)
        rows.append(xp.where(onto, sect, a * (u[None] * prev - b * prev2)))
    return xp.stack(rows, 1)


@functools.lru_cache(maxsize=16)
def _gauss(nlat: int):
    return np.polynomial.legendre.leggauss(nlat)


@functools.lru_cache(maxsize=16)
def _table(degree: int, nlat: int):
    u, _ = _gauss(nlat)
    return _legendre(u, degree, np)


def grid_shape(degree: int) -> tuple[int, int]:
    """(nlat, nlon) of the 3/2 grid of degree L: nlat = ⌊3L/2⌋ + 1 Gauss nodes (exact for
    polynomials of degree 3L in u), nlon = 2·nlat > 3L longitudes."""
    check_int(degree, "degree", minimum=1)
    nlat = 3 * degree // 2 + 1
    return nlat, 2 * nlat


def grid_points(nlat: int, nlon: int, dtype=None) -> np.ndarray:
    """The points of the (nlat, nlon) grid on S² ⊂ R³, ``(nlat, nlon, 3)``: Gauss nodes u ascending,
    φ_k = 2πk/nlon."""
    u, _ = _gauss(nlat)
    phi = 2 * np.pi * np.arange(nlon) / nlon
    s = np.sqrt(1 - u**2)
    pts = np.stack(np.broadcast_arrays(s[:, None] * np.cos(phi)[None], s[:, None] * np.sin(phi)[None],
                                       u[:, None] + 0 * phi[None]), -1)
    return pts.astype(dtype or jnp.result_type(float))


class SphereTransform(eqx.Module):
    """Analysis and synthesis between coefficients of degree <= ``degree`` and values on an
    (nlat, nlon) Gauss grid (default: the 3/2 grid of the degree, :func:`grid_shape`).

    :meth:`analysis` is exact for a function whose products with every Y_lm (l <= degree) the
    grid integrates exactly: degree <= 2·nlat − 1 − L in u and < nlon − L in φ.
    """

    degree: int = eqx.field(static=True)
    nlat: int = eqx.field(static=True)
    nlon: int = eqx.field(static=True)
    table: jax.Array  # p_l^m(u_j): (L+1 [m], L+1 [l], nlat)
    weights: jax.Array  # Gauss weights / 2: (nlat,), summing to 1

    def __init__(self, degree: int, nlat: int | None = None, nlon: int | None = None, dtype=None):
        check_int(degree, "degree", minimum=1)
        lat, lon = grid_shape(degree)
        nlat = lat if nlat is None else check_int(nlat, "nlat", minimum=1)
        nlon = lon if nlon is None else check_int(nlon, "nlon", minimum=1)
        if nlon < 2 * degree + 2:
            raise ValueError(f"SphereTransform: nlon={nlon} longitudes cannot hold degree {degree} "
                             f"(needs nlon >= 2·degree + 2 = {2 * degree + 2})")
        dtype = dtype or jnp.result_type(float)
        self.degree, self.nlat, self.nlon = degree, nlat, nlon
        self.table = jnp.asarray(_table(degree, nlat), dtype)
        self.weights = jnp.asarray(_gauss(nlat)[1] / 2, dtype)

    def synthesis(self, coefficients):
        """Values ``(..., nlat, nlon)`` of the real function with coefficients ``(..., L+1, L+1)``
        (complex, ``[l, m]``)."""
        F = jnp.einsum("...lm,mlj->...jm", coefficients, self.table.astype(coefficients.dtype))
        F = jnp.concatenate([F, jnp.zeros(F.shape[:-1] + (self.nlon // 2 + 1 - F.shape[-1],), F.dtype)], -1)
        return jnp.fft.irfft(F, self.nlon, axis=-1) * self.nlon

    def analysis(self, values):
        """Coefficients ``(..., L+1, L+1)`` (complex, ``[l, m]``) of grid values ``(..., nlat, nlon)``."""
        F = jnp.fft.rfft(values, axis=-1)[..., : self.degree + 1] / self.nlon
        F = F * self.weights.reshape((1,) * (F.ndim - 2) + (-1, 1))
        return jnp.einsum("...jm,mlj->...lm", F, self.table.astype(F.dtype))


def laplacian(degree: int, dtype=None):
    """The eigenvalues −l(l+1) of Δ_S on degree l, shaped ``(L+1, 1)`` to multiply ``[l, m]`` arrays."""
    l = jnp.arange(degree + 1, dtype=dtype or jnp.result_type(float))
    return (-l * (l + 1))[:, None]



def grid_coefficients(values, degree: int):
    """Coefficients up to ``degree`` (``(..., L+1, L+1)`` complex, ``[l, m]``) of a function given by
    its values ``(..., nlat, nlon)`` on a Gauss grid (:func:`grid_points`), e.g. a density against σ
    on the 3/2 grid of its degree."""
    values = jnp.asarray(values)
    if values.ndim < 2:
        raise ValueError(f"grid_coefficients: values must be (..., nlat, nlon), got shape {values.shape}")
    nlat, nlon = values.shape[-2:]
    return SphereTransform(degree, nlat, nlon, values.dtype).analysis(values)


def empirical_coefficients(x, degree: int, weights=None, *, chunk: int = 2048):
    """μ̂_lm = Σ_i w_i conj(Y_lm(x_i)) for l <= ``degree`` (``(L+1, L+1)`` complex, ``[l, m]``) of the
    measure Σ_i w_i δ_{x_i} (weights default 1/n), points ``x`` ``(n, 3)`` on S². Points are taken in
    blocks of ``chunk`` (the Legendre values of a block: (L+1)²·chunk numbers)."""
    check_int(degree, "degree", minimum=1)
    check_int(chunk, "chunk", minimum=1)
    x = jnp.asarray(x)
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"empirical_coefficients: x must be points (n, 3) on S², got shape {x.shape}")
    n = x.shape[0]
    w = jnp.full((n,), 1.0 / n, x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    if w.shape != (n,):
        raise ValueError(f"empirical_coefficients: weights must have shape ({n},), got {w.shape}")
    if is_concrete(x) and n and not np.allclose(np.linalg.norm(np.asarray(x), axis=1), 1.0, atol=1e-5):
        raise ValueError("empirical_coefficients: the points must lie on the unit sphere (|x_i| = 1)")
    pad = (-n) % chunk
    xs = jnp.concatenate([x, jnp.tile(jnp.asarray([[0.0, 0.0, 1.0]], x.dtype), (pad, 1))]).reshape(-1, chunk, 3)
    ws = jnp.concatenate([w, jnp.zeros((pad,), w.dtype)]).reshape(-1, chunk)
    m = jnp.arange(degree + 1)
    cdtype = jnp.result_type(x.dtype, jnp.complex64)

    def block(acc, xw):
        xb, wb = xw
        P = _legendre(jnp.clip(xb[:, 2], -1.0, 1.0), degree, jnp)  # (m, l, chunk)
        phase = jnp.exp(-1j * m[:, None] * jnp.arctan2(xb[:, 1], xb[:, 0])[None]).astype(cdtype)
        return acc + jnp.einsum("mlb,mb,b->lm", P.astype(cdtype), phase, wb.astype(cdtype)), None

    acc, _ = jax.lax.scan(block, jnp.zeros((degree + 1, degree + 1), cdtype), (xs, ws))
    return acc


def negative_sobolev(a, b, s: float = 2.0):
    """‖μ − ν‖_{H^{−s}} = (Σ_{l>=1} (1 + l(l+1))^{−s} Σ_{|m|<=l} |μ̂_lm − ν̂_lm|²)^{1/2} from coefficients
    ``(..., L+1, L+1)`` (``[l, m]``, m >= 0; the m < 0 half by conjugate symmetry), truncated at
    the smaller degree of the two (l = 0, the masses, left out). For s > 1 every measure on S² has a
    finite norm (a Dirac's Σ_l (2l+1)(1 + l(l+1))^{−s}); the truncation leaves out, for n samples
    of a law, about (1/n)·Σ_{l>L}(2l+1)(1 + l(l+1))^{−s} of the square."""
    if not s > 0:
        raise ValueError(f"negative_sobolev: s must be > 0, got {s}")
    a, b = jnp.asarray(a), jnp.asarray(b)
    L = min(a.shape[-1], b.shape[-1]) - 1
    d = a[..., : L + 1, : L + 1] - b[..., : L + 1, : L + 1]
    l = jnp.arange(L + 1, dtype=jnp.real(d).dtype)
    w = jnp.where(l >= 1, (1 + l * (l + 1)) ** (-s), 0.0)[:, None] * jnp.where(jnp.arange(L + 1) >= 1, 2.0, 1.0)[None]
    return jnp.sqrt(jnp.sum(w * jnp.abs(d) ** 2, axis=(-2, -1)))


__all__ = ["SphereTransform", "empirical_coefficients", "grid_coefficients", "grid_points", "grid_shape", "laplacian",
           "negative_sobolev"]
