"""What an experiment is, and the registry the CLI reads.

An experiment is a frozen dataclass of options (its fields become ``--options`` of the
command line, with their defaults), a ``compute`` step that returns arrays, and a
``figures`` step that draws them. The runner (:mod:`._runner`) owns all file output.

Options come from three layers, later ones winning: the dataclass defaults, a TOML file
(``--config file.toml``: flat ``key = value`` pairs named like the fields), and explicit
``--option`` flags. Values are checked against the field types; unknown keys are an error
naming them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REGISTRY: dict[str, "Experiment"] = {}

#: Keys a TOML config may hold besides the option fields.
_META_KEYS = ("experiment",)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A published experiment, runnable as ``transformer-pde run NAME``.

    Attributes:
        name: the command-line name.
        summary: one line for ``transformer-pde list``.
        config: a frozen dataclass type; its fields (int, float, str, bool) are the options.
        compute: ``compute(config, progress: bool) -> dict[str, np.ndarray]``. Optional
            capability: a ``compute`` that also accepts ``checkpoint=`` is *resumable*; the
            runner passes it a :class:`transformer_pde.checkpoint.Checkpoint` to hand to
            :func:`transformer_pde.checkpoint.solve_checkpointed`.
        figures: ``figures(results, config, out_dir: Path) -> list[Path]`` (PNG files).
        tiny: option overrides that make a fast run for the test suite.
    """

    name: str
    summary: str
    config: type
    compute: Callable[..., dict]
    figures: Callable[[dict, Any, Path], list]
    tiny: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"experiment name must be a non-empty string without spaces, got "
                             f"{self.name!r}")
        if not (dataclasses.is_dataclass(self.config) and isinstance(self.config, type)):
            raise ValueError(f"experiment '{self.name}': config must be a dataclass type, got "
                             f"{self.config!r}")
        if not callable(self.compute) or not callable(self.figures):
            raise ValueError(f"experiment '{self.name}': compute and figures must be callables")
        unknown = sorted(set(self.tiny) - self.option_names)
        if unknown:
            raise ValueError(f"experiment '{self.name}': tiny overrides {unknown} are not options")

    @property
    def option_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.config)}

    @property
    def resumable(self) -> bool:
        """True when ``compute`` accepts ``checkpoint=`` (runs can be killed and resumed)."""
        try:
            return "checkpoint" in inspect.signature(self.compute).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
            return False

    def option_types(self) -> dict[str, Any]:
        return typing.get_type_hints(self.config)

    def make_config(self, **overrides):
        """The config with ``overrides`` applied; unknown names and ill-typed values are errors."""
        names = self.option_names
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for experiment '{self.name}'; "
                             f"valid options: {sorted(names)}")
        hints = self.option_types()
        values = {k: coerce_option(self.name, k, hints[k], v) for k, v in overrides.items()}
        return self.config(**values)

    def config_from_mapping(self, mapping: Mapping, source: str = "config", **overrides):
        """Defaults < ``mapping`` (e.g. a parsed TOML file) < ``overrides``."""
        if not isinstance(mapping, Mapping):
            raise ValueError(f"{source}: expected a table of options, got {type(mapping).__name__}")
        nested = sorted(k for k, v in mapping.items() if isinstance(v, Mapping))
        if nested:
            raise ValueError(f"{source}: options must be top-level 'key = value' pairs; found "
                             f"table(s) {nested}")
        exp_name = mapping.get("experiment")
        if exp_name is not None and exp_name != self.name:
            raise ValueError(f"{source} is for experiment {exp_name!r}, not {self.name!r}")
        opts = {k: v for k, v in mapping.items() if k not in _META_KEYS}
        unknown = sorted(set(opts) - self.option_names)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown} for experiment '{self.name}'; "
                             f"valid keys: {sorted(self.option_names)}")
        return self.make_config(**{**opts, **overrides})


def coerce_option(exp_name: str, key: str, typ, value):
    """Check one option value against its field type (ints are accepted for floats)."""
    where = f"experiment '{exp_name}': option {key}"
    if typ is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        if key == "seed" and not 0 <= value < 2**32:
            raise ValueError(f"{where} must be an integer in [0, 2**32), got {value}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        if math.isnan(value):
            raise ValueError(f"{where} must not be NaN")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    return value  # other annotated types: the config's own __post_init__ validates


def load_toml(path) -> dict:
    """Parse a TOML file (``tomllib`` on Python >= 3.11, the ``tomli`` backport before)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"config file {str(path)!r} is a directory") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {e}") from None


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {v!r} ({type(v).__name__}) to TOML")


def config_to_toml(exp: Experiment, config) -> str:
    """The resolved config as TOML; ``--config`` on this file reproduces the run."""
    lines = [f"# resolved options of `transformer-pde run {exp.name}`",
             f"experiment = {_toml_value(exp.name)}"]
    for k, v in dataclasses.asdict(config).items():
        if v is not None:
            lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def register(experiment: Experiment) -> Experiment:
    if experiment.name in REGISTRY:
        raise ValueError(f"experiment '{experiment.name}' is registered twice")
    REGISTRY[experiment.name] = experiment
    return experiment


def get(name: str) -> Experiment:
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment '{name}'; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]
