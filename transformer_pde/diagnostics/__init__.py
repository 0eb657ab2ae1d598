"""Pure functions of a state: clusters, energies, moments, distances (usable in ``stats=``)."""

from .clusters import cluster_count, cluster_labels

__all__ = ["cluster_count", "cluster_labels"]
