"""How a noisy run draws its Brownian path: values given to a noise (``tp.Noise(σ, path=...)``,
``tp.CommonNoise(..., path=...)``): a grid of cells (:class:`BrownianGrid`, the default for constant
steps), a virtual Brownian tree over the run (:class:`BrownianTree`: adaptive steps, Lévy area) or
one draw per step (:class:`BrownianIncrements`)."""

from __future__ import annotations

import abc

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_scalar, is_concrete

__all__ = ["AbstractBrownian", "BrownianGrid", "BrownianIncrements", "BrownianTree", "brownian_levy_area"]


class AbstractBrownian(eqx.Module):
    """How a noisy run draws its Brownian path (a value given to :class:`Noise`)."""

    @abc.abstractmethod
    def path(self, t0, t1, dt0, adaptive: bool, shape, key, levy_area):
        """The ``diffrax.AbstractBrownianPath`` of a run over [t0, t1] (traced)."""

    def check(self, adaptive: bool) -> None:
        """ValueError if this path cannot serve the step-size control."""

    def check_interval(self, t0, t1) -> None:
        """ValueError if this path cannot be drawn on [t0, t1] in the times' dtype."""

    def default_adjoint(self):
        """The adjoint of ``tp.solve`` when none is given."""
        return diffrax.RecursiveCheckpointAdjoint()


class BrownianTree(AbstractBrownian):
    """A ``diffrax.VirtualBrownianTree`` over the run (the default for adaptive steps and the SRK
    solvers, which need Lévy area): any steps, adaptive ones
    included; a run and its refinement see one path (strong errors), chunks of a run too.

    Args:
        tol: the resolution (default ``dt0/2`` for constant steps, diffrax's advice;
            ``(t1 − t0)·2^-20`` for adaptive ones); below it the path is a Brownian-bridge spline.
            Give runs compared path by path one ``tol`` below the smallest step. Each halving
            costs a normal draw per token at every evaluation: on S² at n = 2·10⁴ one tree
            evaluation (5 levels) cost ~10 normal draws of all tokens here.
    """

    tol: float | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if self.tol is not None:
            check_scalar(self.tol, "BrownianTree.tol", positive=True)

    def check_interval(self, t0, t1):
        if self.tol is not None:
            _check_resolution(self.tol, t0, t1, "BrownianTree.tol")

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        if self.tol is not None:
            tol = jnp.asarray(self.tol, t0.dtype)
        elif dt0 is not None and not adaptive:
            tol = dt0 / 2
        else:
            tol = (t1 - t0) * 2.0**-20
        return diffrax.VirtualBrownianTree(t0, t1, tol=tol, shape=shape, key=key, levy_area=levy_area)


def _check_resolution(tol, t0, t1, name):
    """ValueError if the tree would halve [t0, t1] below what the time's dtype resolves: its
    bridges then divide by intervals that round to zero (float32: tol = 1e-30 drew increments of
    2.7e8 and NaN tokens)."""
    if not all(is_concrete(v) for v in (t0, t1)):
        return
    eps = float(jnp.finfo(t0.dtype).eps)
    floor = 4 * eps * max(abs(float(t0)), abs(float(t1)), float(t1) - float(t0))
    if float(tol) < floor:
        raise ValueError(f"{name}={float(tol):.3g} is below what {jnp.dtype(t0.dtype).name} times resolve on "
                         f"[{float(t0):.6g}, {float(t1):.6g}] (need >= {floor:.3g}); use a larger tol or float64")


class BrownianGrid(AbstractBrownian):
    r"""Brownian motion drawn cell by cell on a grid t_k = T0 + kδ (the default for constant
    steps): W(t_{k+1}) − W(t_k) = √δ Z_k with Z_k ~ N(0, I) keyed by the cell index k, and inside a
    cell the Brownian bridge √δ (V_k(u) − u V_k(1)) of a virtual Brownian tree V_k on [0, 1] (keyed
    by k too), so W is one deterministic function of (key, T0, δ) at every time.

    A step on the grid costs one normal draw per token (a step of m cells, m draws); only a step
    end off the grid descends a cell's tree. The virtual tree over the whole run
    (:class:`BrownianTree`) costs ~2(log₂(T/tol) + 2) draws per step instead: at n = 10⁵ on S²
    it made a noisy Euler step 1.5x a deterministic one, this path ~1.05x
    (``benchmarks/noise.py``). Like the tree, and unlike :class:`BrownianIncrements`, a run cut
    into chunks sees one path (the grid is anchored at the Brownian interval's start), runs whose
    steps are multiples of δ see one path (give them one ``dt``, the smallest step), the path is
    reproducible bit for bit and ``jax.grad`` goes through the solve. Adaptive steps work but
    cost one draw per cell crossed (the default there is :class:`BrownianTree`); the stochastic
    Runge–Kutta solvers that need Lévy area (SPaRK, ShARK, ...) take :class:`BrownianTree`.

    Args:
        dt: the cell δ > 0 (default the run's ``dt0``).
        tol: the resolution of the bridge inside a cell, relative to δ (default 2⁻¹⁰).
    """

    dt: float | None = eqx.field(static=True, default=None)
    tol: float = eqx.field(static=True, default=2.0**-10)

    def __check_init__(self):
        if self.dt is not None:
            check_scalar(self.dt, "BrownianGrid.dt", positive=True)
        check_scalar(self.tol, "BrownianGrid.tol", positive=True)

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        if levy_area is not diffrax.BrownianIncrement:
            raise ValueError(f"BrownianGrid draws increments without Lévy area, which this solver needs "
                             f"({levy_area.__name__}); use tp.BrownianTree()")
        if self.dt is not None:
            cell = jnp.asarray(self.dt, t0.dtype)
        elif dt0 is not None:
            cell = dt0
        else:
            raise ValueError("BrownianGrid() takes its cell from dt0: pass dt0=... or BrownianGrid(dt=...)")
        return _GridPath(t0, cell, shape, key, self.tol)


class _GridPath(diffrax.AbstractBrownianPath):
    """:class:`BrownianGrid`'s path: cell increments keyed by index, bridges inside a cell."""

    start: jax.Array
    cell: jax.Array
    shape: object = eqx.field(static=True)
    key: jax.Array
    tol: float = eqx.field(static=True)
    levy_area: type = eqx.field(static=True, default=diffrax.BrownianIncrement)

    @property
    def t0(self):
        return self.start

    @property
    def t1(self):
        return jnp.inf

    def evaluate(self, t0, t1=None, left=True, use_levy=False):
        del left
        if t1 is None:
            t0, t1 = self.start, t0
        t0, t1 = (jax.lax.stop_gradient(jnp.asarray(t, self.cell.dtype)) for t in (t0, t1))
        c0, f0 = self._locate(t0)
        c1, f1 = self._locate(t1)
        k_cells, k_bridge = jax.random.split(self.key)
        leaves, treedef = jax.tree.flatten(self.shape)
        out = []
        for i, leaf in enumerate(leaves):
            kc, kb = jax.random.fold_in(k_cells, i), jax.random.fold_in(k_bridge, i)
            draw = lambda k, kc=kc, leaf=leaf: jax.random.normal(jax.random.fold_in(kc, k), leaf.shape, leaf.dtype)  # noqa: E731
            # whole cells c0 .. c1 − 1 (one draw each), then the partial cells at both ends
            whole = jax.lax.fori_loop(c0, c1, lambda k, acc, draw=draw: acc + draw(k),
                                      jnp.zeros(leaf.shape, leaf.dtype))
            part = lambda c, f, draw=draw, kb=kb, leaf=leaf: self._partial(draw, kb, leaf, c, f)  # noqa: E731
            w = whole + part(c1, f1) - part(c0, f0)
            out.append(jax.lax.stop_gradient(jnp.sqrt(self.cell).astype(leaf.dtype) * w))
        w = jax.tree.unflatten(treedef, out)
        if use_levy:
            return diffrax.BrownianIncrement(dt=t1 - t0, W=w)
        return w

    def _locate(self, t):
        """(cell index, fraction in [0, 1)) of t; a time within rounding of a grid point is on it."""
        u = (t - self.start) / self.cell
        k = jnp.round(u)
        on = jnp.abs(u - k) <= 64 * jnp.finfo(u.dtype).eps * jnp.maximum(1.0, jnp.abs(u))
        c = jnp.where(on, k, jnp.floor(u))
        f = jnp.where(on, 0.0, u - jnp.floor(u))
        return c.astype(jnp.int32), f

    def _partial(self, draw, kb, leaf, c, f):
        """(W(T0 + (c + f)δ) − W(T0 + cδ))/√δ = f Z_c + V_c(f) − f V_c(1) (zero on the grid)."""
        def bridge(f):
            tree = diffrax.VirtualBrownianTree(0.0, 1.0, tol=self.tol, shape=leaf,
                                               key=jax.random.fold_in(kb, c))
            return f * draw(c) + tree.evaluate(f) - f * tree.evaluate(jnp.ones_like(f))
        return jax.lax.cond(f > 0, bridge, lambda f: jnp.zeros(leaf.shape, leaf.dtype), f)


class BrownianIncrements(AbstractBrownian):
    """One independent draw per step (``diffrax.UnsafeBrownianPath``, keyed by the step's times):
    the cheapest path (one normal per token and step), for constant steps only. Reproducible for
    a fixed key and step grid, but a run with another step (or cut into chunks) sees another
    Brownian motion: use :class:`BrownianTree` for strong errors and chunked runs. diffrax cannot
    reverse-differentiate through it (the solve's default adjoint is then ``DirectAdjoint``, for
    forward runs and ``jax.jvp``): use :class:`BrownianTree` for ``jax.grad``."""

    def default_adjoint(self):
        return diffrax.DirectAdjoint()

    def path(self, t0, t1, dt0, adaptive, shape, key, levy_area):
        return diffrax.UnsafeBrownianPath(shape=shape, key=key, levy_area=levy_area)

    def check(self, adaptive):
        if adaptive:
            raise ValueError("BrownianIncrements draws one increment per step and cannot serve "
                             "adaptive steps; use tp.BrownianTree() (the default)")


def brownian_levy_area(solver):
    """The Lévy area the solver's Brownian path must carry (space-time for the SRK solvers)."""
    if isinstance(solver, diffrax.AbstractSRK):
        needed = solver.minimal_levy_area
        if issubclass(needed, diffrax.AbstractSpaceTimeTimeLevyArea):
            return diffrax.SpaceTimeTimeLevyArea
        if issubclass(needed, diffrax.AbstractSpaceTimeLevyArea):
            return diffrax.SpaceTimeLevyArea
    return diffrax.BrownianIncrement
