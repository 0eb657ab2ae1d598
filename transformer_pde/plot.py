"""Matplotlib figures (headless: the Agg backend unless the user chose one)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ._io import atomic_write_bytes, save_gif  # noqa: E402


def _data_points(fig):
    """Per data artist (line, scatter, filled area, image, bar), its points as rows: a point
    is drawn only where every coordinate is finite."""
    from matplotlib.collections import Collection, PathCollection
    from matplotlib.image import AxesImage
    from matplotlib.patches import Rectangle

    for ax in fig.axes:
        for line in ax.get_lines():
            yield np.asarray(line.get_xydata(), float).reshape(-1, 2)
        for coll in ax.collections:
            if isinstance(coll, PathCollection):  # a scatter: its paths are the marker's shape
                yield np.asarray(coll.get_offsets(), float).reshape(-1, 2)
            elif isinstance(coll, Collection):  # areas, line collections: the paths are the data
                paths = [np.asarray(p.vertices, float).reshape(-1, 2) for p in coll.get_paths()]
                yield np.concatenate(paths) if paths else np.zeros((0, 2))
        for image in ax.images:
            if isinstance(image, AxesImage):
                yield np.ma.filled(np.ma.asarray(image.get_array(), float), np.nan).reshape(-1, 1)
        for patch in ax.patches:
            if isinstance(patch, Rectangle):
                yield np.asarray([[patch.get_height(), patch.get_width()]], float)


class EmptyFigureError(ValueError):
    """A figure whose data is all NaN or inf (it would be saved empty)."""


def check_drawn(fig, name: str) -> None:
    """Refuse a figure whose every data artist holds only NaN or inf: it would be saved empty
    while the run reports success."""
    artists = [a for a in _data_points(fig) if a.size]
    if artists and not any(np.isfinite(a).all(axis=1).any() for a in artists):
        raise EmptyFigureError(f"figure {name}: every series it draws is NaN or inf, so it would be empty "
                         f"(the data it plots is not finite)")


def save_figure(fig, path, dpi: int = 130, *, trim: bool = True) -> Path:
    """Save atomically (temporary file + rename) and close the figure; a figure with data that
    is all NaN or inf is refused (:func:`check_drawn`), not saved empty. ``trim`` crops the
    margins to what is drawn (``bbox_inches="tight"``, which draws the figure twice: a figure
    laid out by ``layout="constrained"`` or ``tight_layout`` can pass False, 0.2 s less each)."""
    path = Path(path)
    try:
        check_drawn(fig, path.name)
    except ValueError:
        plt.close(fig)
        raise
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", dpi=dpi, bbox_inches="tight" if trim else None)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def plain_log_labels(axis) -> None:
    """Label a log-scaled ``axis`` (``ax.yaxis``, a colorbar's ``cb.ax.yaxis``) with plain numbers
    (1, 10, 100: matplotlib's ``LogFormatter``, minor ticks labelled by the same rule as the default)
    instead of mathtext powers 10^k: the same ticks, and no mathtext parser for the process to build
    (a cost of the first figure a process draws with mathtext)."""
    from matplotlib.axis import Axis
    from matplotlib.ticker import LogFormatter

    if not isinstance(axis, Axis):
        raise ValueError(f"plain_log_labels: axis must be a matplotlib Axis (ax.xaxis, ax.yaxis, a colorbar's "
                         f"cb.ax.yaxis), got {type(axis).__name__} {axis!r}"[:300])
    axis.set_major_formatter(LogFormatter())
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def save_animation(anim, path, fps: int) -> Path:
    """Save a matplotlib animation as a GIF (Pillow), atomically (temporary file + rename)."""
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise ValueError(f"save_animation: fps must be an integer >= 1, got {fps!r}")
    return save_gif(anim, Path(path), fps)


def sphere_points(ax, x, *, color=None, size=8, title=None):
    """Tokens on S^2 over a faint wireframe sphere, on a 3-D axis."""
    x = np.asarray(x)
    u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85",
                      linewidth=0.3)
    ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=size, c=color if color is not None else "C0",
               depthshade=False)
    ax.set_box_aspect((1, 1, 1))
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


def sphere_snapshots(ts, xs, indices, *, suptitle=None):
    """One 3-D panel per chosen save index; returns the figure."""
    fig = plt.figure(figsize=(3.2 * len(indices), 3.4))
    for k, i in enumerate(indices):
        ax = fig.add_subplot(1, len(indices), k + 1, projection="3d")
        sphere_points(ax, xs[i], title=f"t = {float(ts[i]):.3g}")
    if suptitle:
        fig.suptitle(suptitle)
    return fig
