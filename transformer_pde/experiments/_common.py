"""Helpers shared by the clustering experiments (not experiments themselves)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ..dynamics import AbstractDynamics
from ..spaces import normalize
from ._runner import FILE_MODE


class ResidualSphere(AbstractDynamics):
    r"""The authors' discretization of the sphere dynamics (sphere.md §9, first row):

    x_i ← N(x_i + h Γ_μ(x_i)),  N(x) = x/|x|,

    i.e. a residual attention layer followed by layer normalization, with no explicit
    tangent projection. Under ``solve(..., solver=diffrax.Euler(), dt0=h)`` one step is
    exactly that update. Since N(x + h v) = N(x + h' P⊥_x v) with h' = h/(1 + h⟨x, v⟩), it
    is a first-order scheme for the projected ODE of ``tp.Sphere`` with a per-token time
    change of relative size O(h); use it with Euler only, to reproduce published numbers
    (sphere.md §10.4 was measured with it).
    """

    dynamics: AbstractDynamics

    @property
    def dim(self):
        return self.dynamics.dim

    def _velocity(self, x, weights, t):
        return self.dynamics._velocity(x, weights, t)

    def retract(self, x):
        return normalize(x)


def circle_angles(x):
    """Angles in (−π, π] of tokens on S^1 (shape ``(..., n, 2)``)."""
    return jnp.arctan2(x[..., 1], x[..., 0])


def save_gif(anim, path: Path, fps: int) -> Path:
    """Write a matplotlib animation as a GIF (Pillow), atomically: temp file, then rename."""
    from matplotlib.animation import PillowWriter

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".gif")
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    try:
        anim.save(tmp, writer=PillowWriter(fps=fps))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def parse_floats(text: str, name: str) -> np.ndarray:
    """'1,4,9' -> array([1., 4., 9.]) with a clear error (config fields are CLI strings)."""
    try:
        vals = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not vals:
        raise ValueError(f"{name} must list at least one number, got {text!r}")
    return np.asarray(vals)


def pid(rtol: float, dtype, atol_ratio: float = 1e-2):
    """A PID controller whose tolerance is reachable in ``dtype`` (float32 runs use at least
    100 machine epsilons: a smaller rtol only exhausts max_steps)."""
    import diffrax

    rtol = max(float(rtol), 100 * float(np.finfo(np.dtype(dtype)).eps))
    return diffrax.PIDController(rtol=rtol, atol=rtol * atol_ratio)
