"""What an experiment is, and the registry the CLI reads.

An experiment is a frozen dataclass of options (its fields become ``--options`` of the
command line, with their defaults), a ``compute`` step that returns arrays, and a
``figures`` step that draws them. The runner (:mod:`._runner`) owns all file output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

REGISTRY: dict[str, "Experiment"] = {}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A published experiment, runnable as ``transformer-pde run NAME``.

    Attributes:
        name: the command-line name.
        summary: one line for ``transformer-pde list``.
        config: a frozen dataclass type; its fields (int, float, str, bool) are the options.
        compute: ``compute(config, progress: bool) -> dict[str, np.ndarray]``.
        figures: ``figures(results, config, out_dir: Path) -> list[Path]`` (PNG files).
        tiny: option overrides that make a fast run for the test suite.
    """

    name: str
    summary: str
    config: type
    compute: Callable[[Any, bool], dict]
    figures: Callable[[dict, Any, Path], list]
    tiny: dict = dataclasses.field(default_factory=dict)

    def make_config(self, **overrides):
        names = {f.name for f in dataclasses.fields(self.config)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for experiment '{self.name}'; "
                             f"valid options: {sorted(names)}")
        return self.config(**overrides)


def register(experiment: Experiment) -> Experiment:
    if experiment.name in REGISTRY:
        raise ValueError(f"experiment '{experiment.name}' is registered twice")
    REGISTRY[experiment.name] = experiment
    return experiment


def get(name: str) -> Experiment:
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment '{name}'; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]
