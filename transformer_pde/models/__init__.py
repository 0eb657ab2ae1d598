"""Every dynamics: a velocity field of a weighted token measure (the models room of the house).

- :mod:`.base`: :class:`AbstractDynamics` and the capabilities :class:`AbstractRetractedDynamics`,
  :class:`AbstractManifoldDynamics`.
- :mod:`.attention`: the attention families on R^d (softmax, multi-head, ℓ², Sinkhorn, sigmoid,
  unnormalized; :class:`Causal` wraps any of them but Sinkhorn, ALiBi a key bias), with the capabilities
  :class:`AbstractFieldAttention` (a field at arbitrary queries), :class:`AbstractMaskableAttention` (can be causal),
  :class:`AbstractKernelAttention`, :class:`AbstractNormalizedAttention` and
  :class:`AbstractGaussianClosure`.
- :mod:`.sphere`: the sphere (:class:`Sphere`, projected) and the post-LN layer (:class:`PostLN`).
- :mod:`.normalization`: the normalization schemes of real Transformers (Pre-LN, Peri-LN, Mix-LN,
  nGPT, LN-scaling) as (field, retraction) pairs; :mod:`.mlp`: MLP sublayers and blocks.
- :mod:`.lost_in_the_middle`, :mod:`.perceptron`, :mod:`.random_heads`, :mod:`.mean_shift`,
  :mod:`.rescaled`: the models of single papers; :mod:`.sharding`: any attention split over devices.
"""

from .._lazy import attach_stub as _attach_stub

# the names, and the modules that define them, are listed once, in the stub __init__.pyi
__getattr__, __dir__, __all__ = _attach_stub(__name__, __file__)
