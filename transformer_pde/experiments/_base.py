"""What an experiment is, and the registry the CLI reads.

An experiment is a frozen dataclass of options (its fields become ``--options`` of the
command line, with their defaults; types in :mod:`._options`), a ``compute`` step that
returns a :class:`~transformer_pde.runs.Result` (named arrays and labelled grids), and a
``figures`` step that draws a result, freshly computed or loaded from a run directory. The runs
layer (:mod:`transformer_pde.runs`) owns all file output; an Experiment is what it runs
(:class:`~transformer_pde.runs.runnable.RunnableExperiment`).

Options come from three layers, later ones winning: the dataclass defaults, a TOML file
(``--config file.toml``: flat ``key = value`` pairs named like the fields, lists as arrays),
and explicit ``--option`` flags (lists comma-separated). Values are checked against the field
types; unknown keys are an error naming them.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import pkgutil
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ..runs.result import Result
from ._options import Options, coerce_option, format_value


class Registry(MutableMapping):
    """The experiments by command-line name, each entry (``configs/<module>.py``, which calls
    :func:`register`) imported when first needed: looking up one name imports its entry
    (``configs/<name with - as _>.py``; a name defined elsewhere, such as the second experiment of
    one entry, is found by importing all), and listing, counting or iterating imports every entry.
    A run of one experiment so imports one entry, not all 29 (about 0.1 s of every run)."""

    def __init__(self, package: str):
        self._package = package
        self._entries: dict[str, Experiment] = {}
        self._complete = False

    def add(self, experiment: Experiment) -> None:
        """Register ``experiment`` (:func:`register`); an error if its name is taken."""
        if experiment.name in self._entries:
            raise ValueError(f"experiment '{experiment.name}' is registered twice")
        self._entries[experiment.name] = experiment

    def _import_all(self) -> None:
        if not self._complete:
            package = importlib.import_module(self._package)
            for info in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self._package}.{info.name}")
            self._complete = True

    def __getitem__(self, name: str) -> Experiment:
        if name not in self._entries and isinstance(name, str) and not self._complete:
            module = name.replace("-", "_")
            if module.isidentifier() and importlib.util.find_spec(f"{self._package}.{module}") is not None:
                importlib.import_module(f"{self._package}.{module}")
            if name not in self._entries:
                self._import_all()
        return self._entries[name]

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        self._import_all()
        return iter(dict(self._entries))

    def __len__(self) -> int:
        self._import_all()
        return len(self._entries)

    def __setitem__(self, name: str, experiment: Experiment) -> None:
        self._entries[name] = experiment

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __repr__(self) -> str:
        return f"Registry({sorted(self)})"


REGISTRY: Registry = Registry(__name__.rsplit(".", 1)[0] + ".configs")
"""Every experiment by its command-line name (:class:`Registry`: each entry imported when first
looked up, all of them when listed)."""

#: Keys a TOML config may hold besides the option fields.
_META_KEYS = ("experiment",)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A published experiment, runnable as ``transformer-pde run NAME``.

    Attributes:
        name: the command-line name.
        summary: one line for ``transformer-pde list``.
        config: a frozen dataclass type; its fields are the options (bool, int, float, str,
            ``Literal[...]`` variants, and lists ``tuple[X, ...]``; see :mod:`._options`).
        compute: ``compute(config, progress: bool) -> Result``; with ``resumable=True``,
            ``compute(config, progress, checkpoint=...)``.
        figures: ``figures(result: Result, config, out_dir: Path) -> list[Path]``: draws from
            the result alone (``transformer-pde plot`` calls it on a loaded result).
        tiny: option overrides that make a fast run for the test suite.
        resumable: ``compute`` takes ``checkpoint=`` (a
            :class:`transformer_pde.runs.Checkpoint` to hand to
            :func:`transformer_pde.runs.solve_checkpointed`), so a killed run
            resumes from its last chunk (``transformer-pde run --resume DIR``).
    """

    name: str
    summary: str
    config: type
    compute: Callable[..., Result]
    figures: Callable[[Result, Any, Path], list]
    tiny: dict = dataclasses.field(default_factory=dict)
    resumable: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"experiment name must be a non-empty string without spaces, got "
                             f"{self.name!r}")
        if not (isinstance(self.config, type) and issubclass(self.config, Options)
                and dataclasses.is_dataclass(self.config)):
            raise ValueError(f"experiment '{self.name}': config must be a dataclass deriving from "
                             f"Options, got {self.config!r}")
        if not callable(self.compute) or not callable(self.figures):
            raise ValueError(f"experiment '{self.name}': compute and figures must be callables")
        if not isinstance(self.resumable, bool):
            raise ValueError(f"experiment '{self.name}': resumable must be True or False")
        unknown = sorted(set(self.tiny) - self.option_names)
        if unknown:
            raise ValueError(f"experiment '{self.name}': tiny overrides {unknown} are not options")
        self.make_config(**self.tiny)  # the defaults and the tiny size are valid configs

    @property
    def option_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.config)}

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

    def changed_options(self, old, new) -> dict[str, tuple[str, str]]:
        """Option name -> (old value, new value) as command-line text, for the options in
        which config ``new`` differs from ``old`` (field order)."""
        a, b = dataclasses.asdict(old), dataclasses.asdict(new)
        return {k: (format_value(a[k]), format_value(b[k])) for k in a if a[k] != b[k]}

    def config_toml(self, config) -> str:
        """The resolved config as TOML; ``--config`` on this file reproduces the run."""
        return config_to_toml(self, config)


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
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    except OSError as e:
        raise ValueError(f"config file {str(path)!r} is unreadable: {e.strerror or e}") from None


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


@dataclasses.dataclass(frozen=True)
class Deferred:
    """The function ``name`` of the module ``module``, imported when first called: an experiment's
    entry (``configs/<name>.py``) names its ``compute`` and ``figures`` so, and listing or printing
    ``--help`` imports none of the computation (JAX among it)."""

    module: str
    name: str

    def __call__(self, *args, **kwargs):
        return vars(importlib.import_module(self.module))[self.name](*args, **kwargs)


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to :data:`REGISTRY` under its name (an error if the name is taken);
    returns it. Each experiment's entry (``configs/<name>.py``) calls this once, on import."""
    REGISTRY.add(experiment)
    return experiment


def get(name: str) -> Experiment:
    """The registered experiment called ``name``; a ValueError naming the available ones if none."""
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment '{name}'; available: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]
