"""Pure functions of a state: clusters, energies, moments, distances (usable in ``stats=``)."""

from .clusters import cluster_count, cluster_labels, cluster_masses, clustered_pair_fraction
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
from .energy import (
    attention_matrix,
    energy_rate,
    interaction_energy,
    log_interaction_energy,
    mean_token,
    normalized_energy,
    numerical_rank,
)

__all__ = [
    "attention_matrix",
    "bures_wasserstein",
    "cluster_count",
    "cluster_labels",
    "cluster_masses",
    "clustered_pair_fraction",
    "energy_rate",
    "exact_wasserstein",
    "interaction_energy",
    "lipschitz_rate",
    "log_interaction_energy",
    "mean_token",
    "normalized_energy",
    "numerical_rank",
    "sinkhorn_wasserstein",
    "stability_bound",
    "stability_ratio",
    "support_radius",
    "support_radius_bound",
    "value_norm_integral",
]
