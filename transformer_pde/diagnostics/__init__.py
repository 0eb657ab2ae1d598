"""Pure functions of a state: clusters, energies, moments, distances (one Sinkhorn divergence), the
modes of a KDE, the sliced Wasserstein distance on the sphere (:mod:`.sliced`), relative entropy to
a target density (:mod:`.entropy`); the distances a convergence study measures, values it is given
(:mod:`.study_distances`); and the a-priori bounds those are checked against (:mod:`.bounds`).

Usable as statistics inside a solve: ``tp.solve(..., saveat=diffrax.SaveAt(ts=ts, fn=...))``.
"""

from .._lazy import attach_stub as _attach_stub
from .._lazy import stub_exports as _stub_exports

# the names, and the modules that define them, are listed in the stub __init__.pyi (each module's
# __all__): a name's module is imported on first access, so a run that counts KDE modes or gaps
# imports no model (and no Equinox). The modules are attributes, not exports.
__getattr__, __dir__, _ = _attach_stub(__name__, __file__)
__all__ = sorted(name for name, (_, attr) in _stub_exports(__file__).items() if attr is not None)
