"""Plain NumPy references for the attention velocity fields and the energy dissipation identity
(euclidean.md §2, sphere.md §1).

Written loop-by-loop from the formulas, independent of the package's kernels.
"""

import numpy as np


def softmax_field(queries, x, w, Q, K, V, beta, causal=False):
    out = np.zeros((queries.shape[0], V.shape[0]))
    for i, xi in enumerate(queries):
        num, den = np.zeros(V.shape[0]), 0.0
        scores = [beta * (Q @ xi) @ (K @ y) for y in x]
        top = max(s for j, s in enumerate(scores) if (not causal or j <= i) and w[j] > 0)
        for j, y in enumerate(x):
            if (causal and j > i) or w[j] == 0:
                continue
            e = w[j] * np.exp(scores[j] - top)
            num += e * (V @ y)
            den += e
        out[i] = num / den
    return out


def multihead_field(queries, x, w, Qs, Ks, Vs, Ws, beta):
    total = 0.0
    for Qh, Kh, Vh, Wh in zip(Qs, Ks, Vs, Ws):
        total = total + softmax_field(queries, x, w, Qh, Kh, Vh, beta) @ Wh.T
    return total


def l2_field(queries, x, w, Q, K, V, beta):
    out = np.zeros((queries.shape[0], V.shape[0]))
    for i, xi in enumerate(queries):
        logk = np.array([-beta * np.sum((Q @ xi - K @ y) ** 2) for y in x])
        p = w * np.exp(logk - logk.max())
        out[i] = sum(pj * (V @ y) for pj, y in zip(p, x)) / p.sum()
    return out


def sigmoid_field(queries, x, w, Q, K, V, beta, bias, causal=False):
    out = np.zeros((queries.shape[0], V.shape[0]))
    for i, xi in enumerate(queries):
        for j, y in enumerate(x):
            if causal and j > i:
                continue
            s = beta * (Q @ xi) @ (K @ y) + bias
            out[i] += w[j] / (1.0 + np.exp(-s)) * (V @ y)
    return out


def unnormalized_field(queries, x, w, Q, K, V, beta, shift=0.0, causal=False):
    out = np.zeros((queries.shape[0], V.shape[0]))
    for i, xi in enumerate(queries):
        for j, y in enumerate(x):
            if causal and j > i:
                continue
            out[i] += w[j] * np.exp(beta * (Q @ xi) @ (K @ y) - beta * shift) * (V @ y)
    return out


def sinkhorn_field(x, w, Q, K, V, beta, epsilon, iters=20000, tol=1e-15):
    """Doubly stochastic self-coupling P = diag(u) Kmat diag(v) with P1 = w, Pᵀ1 = w."""
    S = beta * (x @ Q.T) @ (x @ K.T).T / epsilon
    S = S - S.max()
    Kmat = np.exp(S)
    u, v = np.ones(len(w)), np.ones(len(w))
    for _ in range(iters):
        u = w / (Kmat @ v)
        v_new = w / (Kmat.T @ u)
        if np.max(np.abs(v_new - v) / v_new) < tol:
            v = v_new
            break
        v = v_new
    P = u[:, None] * Kmat * v[None, :]
    assert np.allclose(P.sum(1), w, rtol=1e-12, atol=0) and np.allclose(P.sum(0), w, rtol=1e-10)
    return (P @ (x @ V.T)) / P.sum(1, keepdims=True)


def energy_rate(x, beta, w, *, normalized):
    """dE_β/dt along SA (``normalized``) or USA on the sphere, from the dissipation identity
    (sphere.md §1), for E_β = (1/2β) Σ_ij w_i w_j e^{β⟨x_i,x_j⟩}:

    USA: dE/dt = Σ_i w_i |ẋ_i|², ẋ_i = P⊥_{x_i} Σ_j w_j e^{β⟨x_i,x_j⟩} x_j;
    SA:  dE/dt = Σ_i w_i Z_i |ẋ_i|², Z_i = Σ_j w_j e^{β⟨x_i,x_j⟩}, ẋ_i = P⊥_{x_i} Σ_j w_j e^{β⟨x_i,x_j⟩} x_j / Z_i.
    """
    x, w = np.asarray(x), np.asarray(w)
    total = 0.0
    for wi, xi in zip(w, x):
        k = w * np.exp(beta * (x @ xi))
        s = k @ x
        tangent = s - (s @ xi) * xi  # Z_i ẋ_i for SA, ẋ_i for USA
        total += wi * (tangent @ tangent) / (k.sum() if normalized else 1.0)
    return total
