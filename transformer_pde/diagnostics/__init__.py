"""Pure functions of a state: clusters, energies, moments, distances (usable in ``stats=``)."""

from .clusters import cluster_count, cluster_labels
from .distances import (
    bures_wasserstein,
    exact_wasserstein,
    lipschitz_rate,
    sinkhorn_wasserstein,
    stability_bound,
    stability_ratio,
    support_radius,
    support_radius_bound,
    value_norm_integral,
)

__all__ = [
    "bures_wasserstein",
    "cluster_count",
    "cluster_labels",
    "exact_wasserstein",
    "lipschitz_rate",
    "sinkhorn_wasserstein",
    "stability_bound",
    "stability_ratio",
    "support_radius",
    "support_radius_bound",
    "value_norm_integral",
]
