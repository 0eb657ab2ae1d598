"""Spatially sorted tiles: a layout with which a reduction that has a locality radius (Krause
attention's) skips the key tiles that hold no key within the radius of a query tile
(docs: math/attention.md#krause-attention).

Queries and keys are put in Morton (Z-curve) order of their coordinates, so that a tile of
consecutive points is compact; each tile keeps its bounding box, and a query tile visits a key
tile only when the gap between the two boxes is at most the radius. Exactness never depends on
the order: the box gap is a lower bound of the distance of every pair of the two tiles (with a
margin for round-off), so a skipped tile holds no pair within the radius, and a visited one is
masked pair by pair as in any other layout.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .exact import AbstractLayout, DenseOrStreaming, Streaming

MORTON_BITS = 32
"""Bits of a Morton code (uint32): ``32 // p`` per coordinate (at most ``CELL_BITS``) for p <= 32
coordinates; above, the first 32 coordinates order the points (the skip loses sharpness, never
exactness)."""

CELL_BITS = 20
"""At most 2^20 cells per coordinate: the cell index is computed in the points' dtype, and
float32 holds integers exactly only up to 2^24."""


class SpatialTiles(AbstractLayout):
    """The tiles of ``tiles``, with queries and keys sorted along a Morton curve and each key tile
    visited only by the query tiles whose bounding box lies within the reduction's radius of its
    own (module docstring). Time O(n · neighbours) instead of O(n²) when the radius is small against
    the spread of the points; memory that of ``tiles`` plus O(n) for the orders and the boxes.

    Args:
        tiles: the layout whose blocks are used (``tp.kernels.Streaming(key_block, query_block)``,
            or ``DenseOrStreaming`` to stay dense for small problems: the dense path visits all
            pairs at once, nothing to skip). Default: dense up to 512² pairs, tiles of 128 queries
            x 128 keys above (small tiles have tight boxes: more of them are skipped, at some
            cost per tile where none is; benchmarks/README.md#krause-attention-at-large-n).

    Only a reduction with a locality radius can skip: Krause attention with ``radius``. Without one
    (Krause with only ``top_k``: the k nearest keys may be anywhere; softmax reductions) every
    tile is visited and the layout is ``tiles``. Under ``jax.vmap`` the per-tile ``lax.cond``
    becomes a select that computes both branches: the result is the same, the time not saved.
    """

    tiles: AbstractLayout = eqx.field(
        static=True, default=DenseOrStreaming(streaming=Streaming(key_block=128, query_block=128)))

    def __check_init__(self):
        if not isinstance(self.tiles, AbstractLayout) or isinstance(self.tiles, SpatialTiles):
            raise ValueError(f"SpatialTiles.tiles must be an exact-kernel layout other than SpatialTiles "
                             f"(tp.kernels.Streaming(...), Dense() or DenseOrStreaming()), got {self.tiles!r}")

    def blocks(self, m, n, width=0):
        return self.tiles.blocks(m, n, width)


def morton_order(points: Float[Array, "n p"], lo: Float[Array, " p"], hi: Float[Array, " p"]) -> Int[Array, " n"]:
    """The permutation that sorts ``points`` along the Morton curve of the box [lo, hi] (points
    outside are clipped to it): each coordinate cut into 2^b cells, b = min(32 // p, 20), and the
    cell indices' bits interleaved (points in one cell keep their order)."""
    p = min(points.shape[1], MORTON_BITS)
    bits = min(MORTON_BITS // p, CELL_BITS)
    span = jnp.where(hi > lo, hi - lo, 1.0)[None, :p]
    cells = jnp.clip(jnp.floor((points[:, :p] - lo[None, :p]) / span * float(1 << bits)), 0.0, float((1 << bits) - 1))
    cells = cells.astype(jnp.uint32)
    code = jnp.zeros(points.shape[0], jnp.uint32)
    for b in range(bits):
        for c in range(p):
            code = code | (((cells[:, c] >> b) & 1) << (b * p + c))
    return jnp.argsort(code, stable=True)


def tile_boxes(points: Float[Array, "tiles size p"], valid: Bool[Array, "tiles size"]):
    """Per tile, the lower and upper corners of the bounding box of its valid points, shapes
    ``(tiles, p)``."""
    lo = jnp.min(jnp.where(valid[..., None], points, jnp.inf), axis=1)
    hi = jnp.max(jnp.where(valid[..., None], points, -jnp.inf), axis=1)
    return lo, hi


def near_tiles(query_boxes, key_boxes, radius) -> Bool[Array, "qt kt"]:
    """Whether each query tile may hold a pair within ``radius`` of each key tile: the squared gap
    between their boxes, Σ_c max(0, klo_c − qhi_c, qlo_c − khi_c)², at most radius². Rounding is
    monotone, so the gap's computed terms are at most a pair's computed |q_c − k_c|²; the two
    sums of p terms differ from their exact values by a relative p·eps at most, hence the margin
    (1 + 4p·eps): a tile is never skipped for rounding."""
    (qlo, qhi), (klo, khi) = query_boxes, key_boxes
    gap = jnp.maximum(jnp.maximum(klo[None, :, :] - qhi[:, None, :], qlo[:, None, :] - khi[None, :, :]), 0.0)
    gap2 = jnp.sum(gap ** 2, axis=-1)
    p = qlo.shape[1]
    margin = 1.0 + 4 * p * jnp.finfo(gap2.dtype).eps
    return gap2 <= radius ** 2 * margin


__all__ = ["CELL_BITS", "MORTON_BITS", "SpatialTiles", "morton_order", "near_tiles", "tile_boxes"]
