r"""Spectral selection in symmetric attention (Kuehn–Yoon, arXiv 2604.26085; docs:
math/sphere.md#spectral-selection).

On the sphere with QᵀK = V = Vᵀ (``symmetric_attention``) the equilibria include the *pure modes*:
every token at ±e_k, e_k an eigenvector of V (λ_k). With m₊ tokens at +e_k and m₋ at −e_k, the
attention weights do not move to first order and each other eigendirection l ≠ k decouples; the
linearization has, per l, the group-constant block

$$A_l=\lambda_l\begin{pmatrix}p&1-p\\1-q&q\end{pmatrix}-\lambda_k\begin{pmatrix}2p-1&0\\0&2q-1\end{pmatrix},
\qquad p=\frac{m_+e^{\beta\lambda_k}}{m_+e^{\beta\lambda_k}+m_-e^{-\beta\lambda_k}}$$

(q the same with m₊ and m₋ swapped) and the within-group eigenvalues −λ_k(2p − 1), −λ_k(2q − 1).
In closed form: the homogeneous mode (m₋ = 0) is stable iff λ_k > 0 and λ_k > λ_l for all l ≠ k;
the balanced split (m₊ = m₋) iff λ_l < |λ_k| tanh(β|λ_k|) for all l ≠ k and, for λ_k < 0,
λ_l > λ_k (λ_k the most negative eigenvalue). A split along a dominant positive λ_k is therefore
stable too when the other eigenvalues lie below λ_k tanh(βλ_k).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_real, check_scalar, is_concrete
from ..models import SoftmaxAttention


def _spectrum(eigenvalues, k):
    ev = np.asarray(check_real(as_float_array(eigenvalues, "eigenvalues"), "eigenvalues"), dtype=float)
    if ev.ndim != 1 or ev.shape[0] < 2:
        raise ValueError(f"eigenvalues must be a 1-D array of the d >= 2 eigenvalues of V, got shape {ev.shape}")
    k = check_count(k, "k", minimum=0, maximum=ev.shape[0] - 1)
    return ev, k, np.delete(ev, k)


def symmetric_attention(V, beta):
    """The model of arXiv 2604.26085: softmax attention with QᵀK = V = Vᵀ (Q = V, K = I), to be
    wrapped in ``tp.Sphere``. ``V`` must be a symmetric (d, d) matrix."""
    V = as_float_array(V, "V")
    if V.ndim != 2 or V.shape[0] != V.shape[1]:
        raise ValueError(f"V must be a square (d, d) matrix, got shape {V.shape}")
    V = check_real(V, "V")
    if is_concrete(V) and not np.allclose(np.asarray(V), np.asarray(V).T, rtol=0, atol=1e-12 * (1 + float(np.abs(np.asarray(V)).max()))):
        raise ValueError("V must be symmetric (QᵀK = V = Vᵀ), got V − Vᵀ with largest entry "
                         f"{float(np.abs(np.asarray(V) - np.asarray(V).T).max()):.3g}")
    return SoftmaxAttention(V, jnp.eye(V.shape[0], dtype=V.dtype), V, beta)


def pure_mode_growth(eigenvalues, k: int, plus: int, minus: int, beta) -> float:
    """The largest growth rate of the linearized SA flow at the pure mode with ``plus`` tokens at
    +e_k and ``minus`` at −e_k (V's eigenvalues ``eigenvalues``, inverse temperature β > 0): the
    mode is linearly stable iff it is < 0 (module docstring; USA has the same sign, a gradient
    flow of the same energy in another metric)."""
    ev, k, others = _spectrum(eigenvalues, k)
    plus = check_count(plus, "plus", minimum=0)
    minus = check_count(minus, "minus", minimum=0)
    if plus + minus < 1:
        raise ValueError(f"plus + minus must count at least one token, got plus={plus}, minus={minus}")
    beta = float(check_scalar(beta, "beta", positive=True))
    lk = ev[k]

    def own_mass(m, m_other):  # a token's attention on its own group
        return 1.0 / (1.0 + (m_other / m) * np.exp(-2 * beta * lk)) if m else np.nan

    p, q = own_mass(plus, minus), own_mass(minus, plus)
    rates = [-lk * (2 * s - 1) for s, m in ((p, plus), (q, minus)) if m >= 2]  # within a group
    for ll in others:
        if plus and minus:
            a, b = ll * p - lk * (2 * p - 1), ll * (1 - p)
            c, d = ll * (1 - q), ll * q - lk * (2 * q - 1)
            tr, disc = a + d, np.sqrt(max((a - d) ** 2 + 4 * b * c, 0.0))  # bc >= 0: real eigenvalues
            rates.append((tr + disc) / 2)
        else:
            rates.append(ll - lk)
    return float(max(rates))


def homogeneous_mode_stable(eigenvalues, k: int) -> bool:
    """Every token at the same ±e_k is linearly stable iff λ_k > 0 and λ_k > λ_l for every l ≠ k
    (docs: math/sphere.md#spectral-selection); for n >= 2 tokens."""
    ev, k, others = _spectrum(eigenvalues, k)
    return bool(ev[k] > 0 and np.all(others < ev[k]))


def balanced_split_stable(eigenvalues, k: int, beta) -> bool:
    """Half the tokens at +e_k, half at −e_k, is linearly stable iff λ_l < |λ_k| tanh(β|λ_k|) for
    every l ≠ k and, when λ_k < 0, λ_l > λ_k (docs: math/sphere.md#spectral-selection): along a
    negative eigenvalue, it must be the most negative one and no positive one may exceed
    |λ_k| tanh(β|λ_k|) (always so when V is negative definite)."""
    ev, k, others = _spectrum(eigenvalues, k)
    beta = float(check_scalar(beta, "beta", positive=True))
    lk = ev[k]
    return bool(lk != 0 and np.all(others < abs(lk) * np.tanh(beta * abs(lk))) and (lk > 0 or np.all(others > lk)))


def predicted_mode(eigenvalues) -> tuple[int, bool] | None:
    """The paper's global selection: ``(k, False)`` when a positive λ_k exceeds every other |λ_l|
    (all tokens align with ±e_k), ``(k, True)`` when V is negative definite (tokens split by sign
    along e_k, λ_k the most negative eigenvalue), None where neither theorem applies."""
    ev, _, _ = _spectrum(eigenvalues, 0)
    top = int(np.argmax(np.abs(ev)))
    if ev[top] > 0 and np.all(np.abs(np.delete(ev, top)) < ev[top]):
        return top, False
    if np.all(ev < 0) and np.sum(ev == ev.min()) == 1:
        return int(np.argmin(ev)), True
    return None


__all__ = ["balanced_split_stable", "homogeneous_mode_stable", "predicted_mode", "pure_mode_growth",
           "symmetric_attention"]
