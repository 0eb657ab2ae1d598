"""What the runs layer asks of an experiment (the experiments room above implements it:
:class:`transformer_pde.experiments.Experiment`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .result import Result


@runtime_checkable
class RunnableExperiment(Protocol):
    """An experiment the runner can run, continue and redraw (``isinstance`` checks that the
    members are there, as the test suite's runtime type checker does)."""

    name: str
    """Its command-line name (recorded in ``metadata.json``)."""
    summary: str
    config: type
    """The frozen dataclass of its options (a run's ``config`` is an instance)."""
    resumable: bool
    """``compute`` takes ``checkpoint=`` (a :class:`~transformer_pde.runs.Checkpoint`)."""
    compute: Callable[..., Result]
    """``compute(config, progress)``; with ``resumable``, ``compute(config, progress, checkpoint=...)``."""
    figures: Callable[[Result, Any, Path], list]
    """``figures(result, config, out_dir)``: draws from the result alone; returns the paths."""

    def config_from_mapping(self, mapping: Mapping, source: str = ...) -> Any:
        """The config of options ``mapping`` (a saved run's); ValueError naming a bad one."""

    def changed_options(self, old, new) -> dict[str, tuple[str, str]]:
        """Option name -> (old value, new value) as text, for the options that differ."""

    def config_toml(self, config) -> str:
        """The resolved config as TOML (``config.toml``; ``--config`` on it reruns the run)."""


__all__ = ["RunnableExperiment"]
