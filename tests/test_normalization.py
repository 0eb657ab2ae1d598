"""cluster_count compiles once per shape (issue 14, item 4); the normalization schemes follow."""

import jax.numpy as jnp
import numpy as np

import transformer_pde as tp
from transformer_pde.diagnostics import clusters as clusters_module


def np_normalize(x, scale=1.0, gain=None):
    y = scale * x / np.linalg.norm(x, axis=-1, keepdims=True)
    return y if gain is None else y * gain


def np_clusters(x, thresh=0.999):
    """Single linkage on ⟨x_i, x_j⟩ > thresh (x normalized first)."""
    u = np_normalize(x)
    G = (u @ u.T) > thresh
    seen, k = np.zeros(len(u), bool), 0
    for s in range(len(u)):
        if seen[s]:
            continue
        k, stack, seen[s] = k + 1, [s], True
        while stack:
            i = stack.pop()
            for j in np.nonzero(G[i] & ~seen)[0]:
                seen[j] = True
                stack.append(j)
    return k



def test_cluster_count_does_not_retrace():
    rng = np.random.default_rng(1)
    x = np_normalize(rng.standard_normal((37, 3)))
    x[:10] = x[0]
    assert int(tp.diagnostics.cluster_count(jnp.asarray(x), 0.99)) == np_clusters(x, 0.99)
    sizes = (clusters_module._cluster_count._cache_size(), clusters_module._cluster_labels._cache_size())
    for thresh in (0.5, 0.9, 0.999):
        y = np_normalize(rng.standard_normal((37, 3)))
        assert int(tp.diagnostics.cluster_count(jnp.asarray(y), thresh)) == np_clusters(y, thresh)
    assert (clusters_module._cluster_count._cache_size(), clusters_module._cluster_labels._cache_size()) == sizes
