"""Pure functions of a state: clusters, energies, moments, distances (one Sinkhorn divergence).

Usable as statistics inside a solve: ``tp.solve(..., saveat=diffrax.SaveAt(ts=ts, fn=...))``.
"""

from .clusters import (
    atoms,
    cluster_count,
    cluster_labels,
    cluster_masses,
    clustered_pair_fraction,
    gap_clusters,
)
from .distances import (
    bures_wasserstein,
    exact_wasserstein,
    lipschitz_rate,
    sinkhorn_divergence,
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
    perceptron_energy,
)
from .moments import empirical_moments, mean_overlap

__all__ = [
    "atoms",
    "attention_matrix",
    "bures_wasserstein",
    "cluster_count",
    "cluster_labels",
    "cluster_masses",
    "clustered_pair_fraction",
    "empirical_moments",
    "energy_rate",
    "exact_wasserstein",
    "gap_clusters",
    "interaction_energy",
    "lipschitz_rate",
    "log_interaction_energy",
    "mean_overlap",
    "mean_token",
    "normalized_energy",
    "numerical_rank",
    "perceptron_energy",
    "sinkhorn_divergence",
    "sinkhorn_wasserstein",
    "stability_bound",
    "stability_ratio",
    "support_radius",
    "support_radius_bound",
    "value_norm_integral",
]
