"""The `long-context` experiment's options and entry (light: imports no JAX; the computation
is :mod:`transformer_pde.experiments.long_context`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from annotated_types import Ge, Gt, Le

from .._base import Deferred, Experiment, register
from .._options import Options, sizes

_HEAVY = "transformer_pde.experiments.long_context"


@dataclasses.dataclass(frozen=True)
class LongContextConfig(Options):
    dims: tuple[int, ...] = (2, 3, 4, 8)
    """Dimensions d of the sphere S^{d−1} of the keys (each >= 2)."""
    log2_n_min: Annotated[int, Ge(1)] = 10
    """The smallest context, n = 2^log2_n_min keys."""
    log2_n_max: Annotated[int, Le(28)] = 20
    """The largest context, 2^log2_n_max keys (the full table: 24)."""
    seeds: Annotated[int, Ge(2)] = 8
    """Independent draws of the keys per (d, n), resampled for the intervals."""
    lam_min: Annotated[float, Gt(0)] = 1e-3
    """The smallest λ = β/(A_d n)^{2/(d−1)} of the grid."""
    lam_max: Annotated[float, Gt(0)] = 1e3
    """The largest λ of the grid."""
    num_lambdas: Annotated[int, Ge(4)] = 31
    """Points of the λ grid (log-spaced)."""
    collapse_keys: Annotated[float, Gt(1)] = 2.0
    """β_n* is where the effective number of keys e^H falls to this."""
    top: Annotated[int, Ge(2)] = 128
    """Nearest keys kept for the gap-counting scale (its supremum sits near e^{(d−1)/2} of them)."""
    chunk: Annotated[int, Ge(1)] = 2**15
    """Keys per streamed chunk."""
    limit_samples: Annotated[int, Ge(10)] = 4000
    """Draws of the Poisson process for the critical limit."""
    layer_log2_n_min: Annotated[int, Ge(1)] = 7
    """The full self-attention layer (every token a query against all, itself included): the
    smallest n = 2^layer_log2_n_min tokens."""
    layer_log2_n_max: Annotated[int, Ge(0), Le(16)] = 11
    """The layer's largest n = 2^layer_log2_n_max (its cost is n² per β); 0: no layer."""
    layer_seeds: Annotated[int, Ge(2)] = 3
    """Independent draws of the layer's tokens per (d, n) (each averages over its n rows)."""
    seed: int = 0

    def validate(self):
        if any(d < 2 for d in self.dims):
            raise ValueError(f"dims must all be >= 2 (keys on S^(d-1)), got {self.dims}")
        if self.log2_n_max <= self.log2_n_min:
            raise ValueError(f"need log2_n_max > log2_n_min (two sizes at least for a rate), got "
                             f"{self.log2_n_min} and {self.log2_n_max}")
        if self.lam_max <= self.lam_min:
            raise ValueError(f"need lam_max > lam_min, got {self.lam_min} and {self.lam_max}")
        if self.layer_log2_n_max and self.layer_log2_n_max <= self.layer_log2_n_min:
            raise ValueError(f"need layer_log2_n_max > layer_log2_n_min (or 0: no layer), got "
                             f"{self.layer_log2_n_min} and {self.layer_log2_n_max}")
        if self.top > 2**self.log2_n_min:
            raise ValueError(f"top ({self.top}) must not exceed the smallest n = 2^{self.log2_n_min}")

    def footprint(self):
        return {"weights of a chunk, every β and seed": sizes(self, "seeds", "chunk", "num_lambdas"),
                "weights of a block of the layer, every β": sizes(self, ("block rows", 256), ("block columns", 1024),
                                                                  "num_lambdas")}

    @property
    def ns(self) -> np.ndarray:
        return 2 ** np.arange(self.log2_n_min, self.log2_n_max + 1)

    @property
    def layer_ns(self) -> np.ndarray:
        if not self.layer_log2_n_max:
            return np.zeros(0, dtype=int)
        return 2 ** np.arange(self.layer_log2_n_min, self.layer_log2_n_max + 1)

    @property
    def lambdas(self) -> np.ndarray:
        return np.geomspace(self.lam_min, self.lam_max, self.num_lambdas)


register(Experiment(
    "long-context",
    "fixed query vs n uniform keys on S^(d-1): critical β_n* (entropy collapse) vs n^(2/(d-1)), log n, gap counting",
    LongContextConfig,
    Deferred(_HEAVY, "compute"), Deferred(_HEAVY, "figures")
    ,
    tiny=dict(dims=(2, 3), log2_n_min=8, log2_n_max=11, seeds=4, num_lambdas=13, top=16, chunk=512,
              limit_samples=200, layer_log2_n_min=6, layer_log2_n_max=8, layer_seeds=2)))
