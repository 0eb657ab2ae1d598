"""What the sharding workers (sharding_worker.py, fast_sharding_worker.py) share; imported after
each has set XLA_FLAGS and float64 (not collected by pytest)."""

import jax
import numpy as np

VEL = jax.jit(lambda dyn, x, w: dyn.vector_field(x, w, 0.0))
"""The velocity of a dynamics at time 0, compiled (what a solve evaluates each stage)."""


def rel_err(out, ref):
    """max |out - ref| / max(1, max |ref|)."""
    out, ref = np.asarray(out), np.asarray(ref)
    return float(np.max(np.abs(out - ref)) / max(1.0, np.max(np.abs(ref))))
