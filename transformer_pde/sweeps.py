r"""Parameter sweeps: one dynamics over a grid of parameters, in one vmapped call.

``tp.sweep(fn, axes={"beta": betas, "seed": seeds})`` evaluates ``fn(beta=..., seed=...)`` at
every point of the outer product of the axes. ``fn`` builds a model from the parameters, solves
it and returns diagnostics (a pytree of arrays); everything it does must be traceable, so that
the whole grid is one ``jax.vmap`` over a flat parameter axis, mapped over chunks of
``chunk_size`` points (``jax.lax.map``) so that memory stays bounded, and sharded over the
devices when there are several. Axes that change shapes (the dimension d, the number of tokens
n, a number of layers) are ``static=`` axes, looped over in Python: one compilation each.

Sweeping the horizon: a traced ``t1`` cannot size the step loop, so pass ``max_steps`` to
:func:`tp.solve` (e.g. ``ceil(max(t1) / dt0)``).

Results come back as :class:`xarray.DataArray` s whose leading dimensions are named after the
grid axes, with the swept values as coordinates (``out.sel(beta=2.0)``, ``out.median("seed")``,
``out.to_netcdf(...)``), and :func:`heatmap` draws any two of them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from ._checks import carry_checks, check_count, check_real
from ._programs import run_program

if TYPE_CHECKING:  # imported when a sweep returns (importing the package stays light)
    import xarray as xr


def _flatten_grid(axes: Mapping[str, Sequence | ArrayLike]):
    names = list(axes)
    coords = {k: np.asarray(v) for k, v in axes.items()}
    for k, c in coords.items():
        if c.ndim != 1 or c.size < 1:
            raise ValueError(f"sweep axis '{k}' must be a non-empty 1-D sequence, got shape {c.shape}")
    mesh = np.meshgrid(*(coords[k] for k in names), indexing="ij")
    return names, coords, {k: m.reshape(-1) for k, m in zip(names, mesh)}


def _device_mesh(devices):
    from jax.sharding import Mesh

    return Mesh(np.asarray(devices), ("points",))


def _map_chunks_of(fn, params, static_kwargs):
    """params: dict of (num_chunks, chunk) arrays -> outputs (num_chunks, chunk, ...). The map and
    the vmap carry ``fn``'s checks out when the program is kept (``carry_checks``)."""
    one_chunk = carry_checks(jax.vmap, lambda p: fn(**p, **static_kwargs))
    return carry_checks(_lax_map, one_chunk)(params)


def _lax_map(f):
    return functools.partial(jax.lax.map, f)


_map_chunks = eqx.filter_jit(_map_chunks_of)


def _estimate_bytes_per_point(fn, flat, static_kwargs):
    """Memory of the vmapped program at chunk sizes 1 and 2 (compile only, nothing runs)."""
    sizes = []
    for c in (1, 2):
        params = {k: jnp.asarray(v[:1]).repeat(c)[None] for k, v in flat.items()}
        compiled = jax.jit(lambda p: _map_chunks(fn, p, static_kwargs)).lower(params).compile()
        mem = compiled.memory_analysis()
        if mem is None:
            return None
        sizes.append(mem.temp_size_in_bytes + mem.output_size_in_bytes + mem.argument_size_in_bytes)
    return max(sizes[1] - sizes[0], 1), sizes[0]


def sweep(
    fn: Callable,
    axes: Mapping[str, Sequence | ArrayLike],
    *,
    static: Mapping[str, Sequence | ArrayLike] | None = None,
    chunk_size: int | None = None,
    max_memory: int | None = None,
    devices: Sequence | None = None,
    dtype=None,
    progress: Callable[[str], None] | None = None,
):
    """Evaluate ``fn(**params)`` on the outer product of ``axes`` (and ``static`` axes).

    Args:
        fn: ``fn(**point) -> pytree of arrays`` (e.g. a dict of diagnostics at saved times).
            Must be traceable in the ``axes`` parameters (they arrive as scalars inside vmap);
            ``static`` parameters arrive as Python values.
        axes: name -> 1-D coordinates. All points run in one compiled, vmapped call.
        static: name -> values that change shapes (d, n, ...): one call per combination.
        chunk_size: points per vmapped chunk (default: all points in one chunk, or as many as
            ``max_memory`` allows). Chunks run one after another inside the same call.
        max_memory: bytes the vmapped chunk may use; the per-point cost is read from XLA's
            memory analysis of the compiled program.
        devices: devices to shard each chunk over (default ``jax.devices()``); the chunk size
            is rounded up to a multiple of their number.
        dtype: floating dtype for the swept coordinates (default: JAX's default float).
        progress: called with a line of text after each static combination.

    Returns:
        For a dict output ``{key: DataArray}`` (each named ``key``), otherwise one
        :class:`xarray.DataArray` named ``"value"`` (a pytree of several leaves: the same tree of
        DataArrays named ``value_0``, ...). The dims are ``(*static, *axes)`` with the swept values
        as coordinates, followed by the output's own dims (``dim_0``, ..., no coordinates).

    Example:
        ```python
        import jax.numpy as jnp, jax.random as jr, transformer_pde as tp

        x0 = tp.uniform_sphere(jr.key(0), n=16, d=3)

        def mean_cosine(beta):                                  # beta arrives as a traced scalar
            x = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(d=3, beta=beta)), x0, t1=2.0, dt0=0.1).xs[-1]
            return jnp.mean(x @ x.T)

        da = tp.sweep(mean_cosine, axes={"beta": jnp.array([0.5, 1.0, 4.0])})   # one vmapped call
        da.dims, da.sel(beta=1.0).item()                        # ('beta',), a float
        ```
    """
    import xarray as xr

    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    if not isinstance(axes, Mapping):
        raise ValueError(f"axes must be a dict name -> 1-D coordinates (e.g. {{'beta': [0.5, 1.0]}}), got "
                         f"{type(axes).__name__} {axes!r}"[:300])
    if not axes:
        raise ValueError("axes must hold at least one vmapped axis (sweep needs one), got {}")
    if static is not None and not isinstance(static, Mapping):
        raise ValueError(f"static must be a dict name -> list of values (e.g. {{'d': [2, 3]}}), got "
                         f"{type(static).__name__} {static!r}"[:300])
    static = dict(static or {})
    clash = set(static) & set(axes)
    if clash:
        raise ValueError(f"axes {sorted(clash)} are both static and vmapped")
    for k, v in static.items():
        # a static axis lists its values, one call each: a bare value (d=3) is an axis of one
        if not (isinstance(v, (list, tuple, range)) or (isinstance(v, (np.ndarray, jax.Array)) and v.ndim == 1)):
            raise ValueError(f"static axis '{k}' must be a list of values (one call per value), got "
                             f"{type(v).__name__} {v!r}; write static={{{k!r}: [{v!r}]}} for one value"[:300])
        if len(v) < 1:
            raise ValueError(f"static axis '{k}' is empty")
    if chunk_size is not None:
        chunk_size = check_count(chunk_size, "chunk_size", minimum=1)
    if max_memory is not None:
        max_memory = check_count(max_memory, "max_memory", minimum=1, maximum=None)
    dtype = jnp.dtype(dtype or jnp.result_type(float))
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype (the swept coordinates are cast to it: "
                         f"1.5 would become 1 as {dtype}), got {dtype}")
    names, coords, flat = _flatten_grid(axes)
    P = next(iter(flat.values())).size
    flat = {k: (v.astype(dtype) if np.issubdtype(v.dtype, np.floating) else v) for k, v in flat.items()}
    devices = list(jax.devices() if devices is None else devices)

    static_names = list(static)
    combos = list(itertools.product(*(static[k] for k in static_names))) or [()]
    outputs = []
    for combo in combos:
        skw = dict(zip(static_names, combo))
        chunk = P if chunk_size is None else min(int(chunk_size), P)
        if max_memory is not None and chunk_size is None:
            est = _estimate_bytes_per_point(fn, flat, skw)
            if est is not None:
                per_point, base = est
                chunk = int(max(1, min(P, (int(max_memory) - base) // per_point + 1)))
        D = len(devices)
        chunk = -(-chunk // D) * D
        num_chunks = -(-P // chunk)
        pad = num_chunks * chunk - P
        # padding repeats the last point: valid parameters, results dropped below
        params = {k: jnp.asarray(np.concatenate([v, np.repeat(v[-1:], pad)])).reshape(num_chunks, chunk)
                  for k, v in flat.items()}
        if D > 1:
            from jax.sharding import NamedSharding, PartitionSpec

            sharding = NamedSharding(_device_mesh(devices), PartitionSpec(None, "points"))
            params = jax.device_put(params, sharding)
        # kept between processes inside tp.runs.kept_programs (fn's solves are traced in it)
        out = run_program(_map_chunks_of, _map_chunks, (fn, params, skw))
        total = num_chunks * chunk
        out = jax.tree.map(lambda a, total=total: np.asarray(a).reshape(total, *a.shape[2:])[:P], out)
        outputs.append(out)
        if progress is not None:
            progress(f"{skw or 'grid'}: {P} points in {num_chunks} chunk(s) of {chunk}")

    grid_shape = tuple(coords[k].size for k in names)
    static_shape = tuple(len(static[k]) for k in static_names)
    static_coords = {k: np.asarray(static[k]) for k in static_names}

    def label(name, *leaves):
        stacked = np.stack(leaves).reshape(static_shape + grid_shape + leaves[0].shape[1:])
        extra = [f"dim_{i}" for i in range(leaves[0].ndim - 1)]
        return xr.DataArray(stacked, coords={**static_coords, **coords},
                            dims=(*static_names, *names, *extra), name=name)

    first = outputs[0]
    if isinstance(first, dict):
        return {k: label(k, *(o[k] for o in outputs)) for k in first}
    leaves, treedef = jax.tree.flatten(first)
    if treedef.num_leaves == 1 and not treedef.children():
        return label("value", *(jax.tree.leaves(o)[0] for o in outputs))
    per_output = [jax.tree.leaves(o) for o in outputs]
    labeled = [label(f"value_{i}", *(po[i] for po in per_output)) for i in range(len(leaves))]
    return jax.tree.unflatten(treedef, labeled)


def heatmap(arr: xr.DataArray, x: str, y: str, *, ax=None, log_x: bool = False, log_y: bool = False,
            log_color: bool = False, cmap: str = "viridis", colorbar: bool = True, annotate: bool = False,
            fmt: str = "{:.3g}", **kwargs):
    """Draw a 2-D :class:`xarray.DataArray` (dims ``x`` and ``y``) as a heatmap; NaN cells blank.

    Cells are centred on the coordinates (``pcolormesh`` with edges halfway between points,
    geometric halfway on a log axis; a dim without coordinates counts 0, 1, ...); the colorbar
    is labelled with the array's name. Returns the matplotlib ``QuadMesh``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    if set(arr.dims) != {x, y} or arr.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array with dims ({x!r}, {y!r}), got dims {arr.dims}; "
                         f"select or reduce the others first")
    z = np.asarray(arr.transpose(y, x).values, dtype=float)

    def coord(dim):
        return np.asarray(arr[dim].values) if dim in arr.coords else np.arange(arr.sizes[dim])

    ax = ax or plt.gca()

    def edges(c, log):
        c = np.asarray(c, dtype=float)
        if c.size == 1:
            return np.array([c[0] * 0.9, c[0] * 1.1]) if log else np.array([c[0] - 0.5, c[0] + 0.5])
        u = np.log(c) if log else c
        mid = (u[1:] + u[:-1]) / 2
        e = np.concatenate([[u[0] - (mid[0] - u[0])], mid, [u[-1] + (u[-1] - mid[-1])]])
        return np.exp(e) if log else e

    norm = None
    if log_color:
        pos = z[np.isfinite(z) & (z > 0)]
        if pos.size:
            norm = LogNorm(vmin=pos.min(), vmax=pos.max())
    mesh = ax.pcolormesh(edges(coord(x), log_x), edges(coord(y), log_y),
                         np.ma.masked_invalid(z), cmap=cmap, norm=norm, shading="flat", **kwargs)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label=arr.name)
    if annotate:
        for i, yv in enumerate(coord(y)):
            for j, xv in enumerate(coord(x)):
                if np.isfinite(z[i, j]):
                    ax.text(xv, yv, fmt.format(z[i, j]), ha="center", va="center", fontsize=7,
                            color="w")
    return mesh


def first_time(ts, condition) -> jax.Array:
    """The first ``ts[k]`` with ``condition[..., k]`` true (inf when never): e.g. the time to
    reach one cluster from a saved cluster count, ``first_time(ts, counts == 1)``.

    ``ts``: finite times, shape ``(T,)``; ``condition``: booleans ``(..., T)``."""
    ts = jnp.asarray(check_real(ts, "ts"))
    hit = jnp.asarray(condition)
    if ts.ndim != 1:
        raise ValueError(f"ts must be a 1-D array of times, got shape {ts.shape}")
    if hit.ndim < 1 or hit.shape[-1] != ts.shape[0]:
        raise ValueError(f"condition must have shape (..., {ts.shape[0]}) (the times on its last axis, as ts), "
                         f"got shape {hit.shape}")
    idx = jnp.argmax(hit, axis=-1)
    return jnp.where(jnp.any(hit, axis=-1), ts[idx], jnp.inf)


__all__ = ["first_time", "heatmap", "sweep"]
