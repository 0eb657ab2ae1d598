r"""What a study measures at each save: the distances of μ^n_t (and of the tracers) to the
reference (the package docstring defines each metric)."""

from __future__ import annotations

import jax.numpy as jnp

from ..diagnostics.distances import bures_wasserstein
from ..diagnostics.moments import unchecked_moments as empirical_moments  # per save: no checks

METRICS = ("mean", "cov", "bw", "coupling", "flow_bw", "w1", "w2")
"""The metrics of every study, in the order reports list them."""


def measure(x, z, m_ref, S_ref, y_ref, b_ref, distance, with_w2) -> dict:
    """The metrics of the particles ``x`` and their tracers ``z`` against a reference with moments
    ``(m_ref, S_ref)`` and measure Σ b_j δ_{y_j} (``b_ref`` None: uniform), ``unconverged`` too;
    the transport distance only where ``distance`` is exact or ``with_w2``."""
    m, S = empirical_moments(x)
    mz, Sz = empirical_moments(z)
    out = {
        "mean": jnp.linalg.norm(m - m_ref),
        "cov": jnp.linalg.norm(S - S_ref),
        "bw": bures_wasserstein(m, S, m_ref, S_ref),
        "coupling": jnp.sqrt(jnp.mean(jnp.sum((x - z) ** 2, axis=-1))),
        "flow_bw": bures_wasserstein(mz, Sz, m_ref, S_ref),
    }
    if with_w2 or distance.exact:
        b = jnp.full(y_ref.shape[:1], 1.0 / y_ref.shape[0], x.dtype) if b_ref is None else b_ref
        out.update(distance(x, y_ref, b))
    else:
        out.update(w1=jnp.full((), jnp.nan, x.dtype), w2=jnp.full((), jnp.nan, x.dtype),
                   unconverged=jnp.zeros((), bool))
    return out
