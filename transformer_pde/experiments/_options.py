"""Typed experiment options: what a config field may be, how a value is checked, and the
range checks the configs share.

A config is a frozen dataclass whose fields are the options. A field is one of

* ``bool``, ``int``, ``float``, ``str``;
* ``Literal["a", "b"]``: a string chosen among variants;
* ``tuple[int, ...]``, ``tuple[float, ...]``, ``tuple[Literal[...], ...]``: a list of distinct
  values (a list labels an axis of the results: ``--dims 2,2`` is refused).

Values arrive in two forms and are checked in one place (:func:`coerce_option`): native
values (Python defaults, TOML arrays such as ``betas = [0.5, 1, 4]``, JSON lists of a saved
run) and command-line text, parsed once by :func:`parse_option_text` (``--betas 0.5,1,4``).
Errors name the option and, for a list, the bad item. Floats (options and list items)
must be finite: NaN and inf are refused wherever they come from.

Configs derive from :class:`Options`: constructing one checks every field against its type
(so a config built in Python is checked like one from the command line), then against the range
declared with it in the annotated-types vocabulary (``n: Annotated[int, Ge(2)]``; ``Gt``, ``Le``,
``Lt``, ``Interval(gt=0, le=1)``), then runs its ``validate()``, which keeps the checks between
options, then bounds its sizes: ``footprint()`` declares the run's largest arrays by the options
that size them, and one above :data:`ELEMENT_BUDGET` elements is refused, naming them. Floats must
be normal float32 numbers (the dtype of the runs): 1e39 and 1e-40 are refused. The help text of an
option is the docstring under its field (PEP 257 attribute docstrings, :func:`option_docs`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import re
import textwrap
import typing
from typing import Annotated, Literal

import annotated_types as at

# ----------------------------------------------------------------------------- field types


def _literal_choices(typ) -> tuple | None:
    return typing.get_args(typ) if typing.get_origin(typ) is Literal else None


def list_item_type(typ):
    """The item type of a ``tuple[X, ...]`` option, None for a scalar option."""
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"list options are typed tuple[X, ...], got {typ}")
        return args[0]
    return None


def type_name(typ) -> str:
    """A short name for help texts and errors: 'float', 'SA|USA', 'float,...'."""
    item = list_item_type(typ)
    if item is not None:
        return f"{type_name(item)},..."
    choices = _literal_choices(typ)
    if choices is not None:
        return "|".join(choices)
    return typ.__name__ if isinstance(typ, type) else str(typ)


def format_value(value) -> str:
    """A value as it is written on the command line (lists comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ----------------------------------------------------------------------------- checking values

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32 (``np.finfo(np.float32).max``; this module imports no NumPy)."""
FLOAT32_TINY = 1.1754943508222875e-38
"""The smallest normal float32 (``np.finfo(np.float32).tiny``): XLA flushes smaller ones to zero."""


def _coerce_scalar(where: str, typ, value):
    """One scalar (or one list item) against its type; ints are accepted for floats."""
    choices = _literal_choices(typ)
    if choices is not None:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value  # its range: coerce_option
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        try:
            out = float(value)
        except OverflowError:  # an int beyond the float range
            raise ValueError(f"{where} must be a finite number, got {value!r}") from None
        if math.isnan(out):
            raise ValueError(f"{where} must not be NaN")
        if math.isinf(out):
            raise ValueError(f"{where} must be finite, got {value!r}")
        if out != 0 and not FLOAT32_TINY <= abs(out) <= FLOAT32_MAX:
            # checked in the dtype the runs use: 1e39 is finite here and inf in float32, 1e-40 a
            # positive step here and zero (flushed subnormal) in XLA's float32
            raise ValueError(f"{where} must be 0 or of magnitude in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}] "
                             f"(a normal float32: the runs compute in float32), got {value!r}")
        return out
    if typ is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported option type {typ!r}")


def coerce_option(exp_name: str | None, key: str, typ, value):
    """Check one native option value against its field type; returns the typed value.

    Lists must arrive as lists or tuples (a TOML array); comma-separated text is the
    command line's form, parsed by :func:`parse_option_text` before it gets here.
    """
    where = f"experiment '{exp_name}': option {key}" if exp_name else f"option {key}"
    item_type = list_item_type(typ)
    if item_type is None:
        out = _coerce_scalar(where, typ, value)
        if key == "seed" and not 0 <= out < 2**32:
            raise ValueError(f"{where} must be an integer in [0, 2**32), got {out}")
        if typ is int and key != "seed":
            _check_int_range(where, out)
        return out
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} must be a list of {type_name(item_type)} (a TOML array such as "
                         f"{key} = [...], or {key} = a,b,... on the command line), got {value!r}")
    if not value:
        raise ValueError(f"{where} must list at least one value, got an empty list")
    items = tuple(_coerce_scalar(f"{where}: item {i} ({v!r})", item_type, v)
                  for i, v in enumerate(value))
    if item_type is int:
        for i, v in enumerate(items):
            _check_int_range(f"{where}: item {i} ({v!r})", v)
    # a list option names the values of an axis (a grid, a set of models): one of each
    seen = {}
    for i, v in enumerate(items):
        if v in seen:
            raise ValueError(f"{where} lists {v!r} twice (items {seen[v]} and {i}); its values "
                             f"label an axis of the results and must be distinct")
        seen[v] = i
    return items


INT_LIMIT = 2**31
"""Integer options (counts, sizes, steps; seeds apart) lie in [-2**31, 2**31): JAX counts in
int32, and a larger count could not be allocated or stepped through anyway."""


def _check_int_range(where: str, value: int) -> None:
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"{where} must lie in [-2**31, 2**31), got {value}")


def parse_option_text(exp_name: str, key: str, typ, text: str):
    """Command-line text -> a typed value (``"0.5,1,4"`` -> ``(0.5, 1.0, 4.0)``).

    Raises ValueError naming the option and, for lists, the item that does not parse.
    """
    where = f"option {key}"
    item_type = list_item_type(typ)
    if item_type is None:
        return coerce_option(exp_name, key, typ, _parse_scalar(where, typ, text))
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(s == "" for s in items):
        raise ValueError(f"{where} must be a comma-separated list of {type_name(item_type)}, got "
                         f"{text!r}")
    choices = _literal_choices(item_type)
    if choices is not None:
        bad = [s for s in items if s not in choices]
        if bad:
            raise ValueError(f"{where} must be a comma-separated subset of ({', '.join(choices)}), "
                             f"got {text!r}: {', '.join(map(repr, bad))} is not one of them")
    values = [_parse_scalar(f"{where}: item {i} ({s!r})", item_type, s) for i, s in enumerate(items)]
    return coerce_option(exp_name, key, typ, values)


def _parse_scalar(where: str, typ, text: str):
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where} must be an integer, got {text!r}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{where} must be a number, got {text!r}") from None
    return text  # str and Literal: checked by coerce_option


# ----------------------------------------------------------------------------- ranges

_BOUNDS = (at.Ge, at.Gt, at.Le, at.Lt)


def option_bounds(cls) -> dict[str, tuple[at.BaseMetadata, ...]]:
    """The declared ranges of a config class: option name -> its ``Annotated`` constraints
    (annotated-types ``Ge``, ``Gt``, ``Le``, ``Lt``; an ``Interval`` is its parts). Every value
    (each item of a list) is checked; ``--help`` shows the range."""
    out = {}
    for name, typ in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(typ) is not Annotated:
            continue
        bounds = []
        for m in typing.get_args(typ)[1:]:
            parts = list(m) if isinstance(m, at.GroupedMetadata) else [m]
            for b in parts:
                if isinstance(b, at.BaseMetadata) and not isinstance(b, _BOUNDS):
                    raise TypeError(f"{cls.__name__}.{name}: option ranges are Ge, Gt, Le, Lt or Interval, "
                                    f"got {b!r}")
                if isinstance(b, _BOUNDS):
                    bounds.append(b)
        if bounds:
            out[name] = tuple(bounds)
    return out


def _holds(bound, value) -> bool:
    if isinstance(bound, at.Ge):
        return value >= bound.ge
    if isinstance(bound, at.Gt):
        return value > bound.gt
    if isinstance(bound, at.Le):
        return value <= bound.le
    return value < bound.lt


def describe_range(bounds) -> str:
    """The range as text: '>= 2', '> 0', 'in (0, 1]'."""
    low = [(f"{b.ge:g}", "[", ">=") if isinstance(b, at.Ge) else (f"{b.gt:g}", "(", ">")
           for b in bounds if isinstance(b, (at.Ge, at.Gt))]
    high = [(f"{b.le:g}", "]", "<=") if isinstance(b, at.Le) else (f"{b.lt:g}", ")", "<")
            for b in bounds if isinstance(b, (at.Le, at.Lt))]
    if len(low) == 1 and len(high) == 1:
        (lo, left, _), (hi, right, _) = low[0], high[0]
        return f"in {left}{lo}, {hi}{right}"
    return ", ".join(f"{op} {v}" for v, _, op in low + high)


COMMON_HELP = {
    "n": "Number of tokens.",
    "d": "Dimension of the space the tokens live in.",
    "beta": "Inverse temperature β of the attention.",
    "t1": "Final time (depth).",
    "dt": "Time step (the layer step of discrete layers).",
    "seed": "Seed of the random draws.",
    "seeds": "Independent draws averaged over.",
    "num_saves": "Number of saved times from 0 to the final time (evenly spaced unless said otherwise).",
    "threshold": "Two tokens are in one cluster when their cosine exceeds this.",
    "rtol": "Relative tolerance of the adaptive time steps.",
}
"""Help of the options many experiments share, where a config does not document them itself."""


def option_docs(cls) -> dict[str, str]:
    """The attribute docstrings of a config class (the string under a field, PEP 257), by option
    name, else :data:`COMMON_HELP`: the help texts of ``transformer-pde run NAME --help``. Read
    from the source, so a class defined where no source is kept has only the common ones.
    Parsed once per class (reading the source is most of the time of parsing a command line)."""
    return dict(_option_docs(cls))


@functools.lru_cache(maxsize=None)
def _option_docs(cls) -> dict[str, str]:
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {k: v for k, v in COMMON_HELP.items() if k in names}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, doc in zip(body, body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                docs[field.target.id] = " ".join(inspect.cleandoc(doc.value.value).split())
    return docs


def _check_bounds(values: dict, bounds: dict[str, tuple], reasons: dict[str, str] | None = None) -> None:
    """Raise for the options whose values (any item of a list) leave their range, naming them
    all with their values: "need n >= 2, t1 > 0; got n=1, t1=0" (field order), then the reason
    of each range that has one (``Options.range_reasons``): "...; betas > 0: the laws assume it"."""
    bad = [name for name, kinds in bounds.items()
           if not all(_holds(b, v) for b in kinds
                      for v in (values[name] if isinstance(values[name], tuple) else (values[name],)))]
    if bad:
        need = ", ".join(f"{name} {describe_range(bounds[name])}" for name in bad)
        got = ", ".join(f"{name}={format_value(values[name])}" for name in bad)
        why = "".join(f"; {name} {describe_range(bounds[name])}: {reasons[name]}"
                      for name in bad if reasons and name in reasons)
        raise ValueError(f"need {need}; got {got}{why}")


# ----------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of the experiment configs (frozen dataclasses whose fields are the options).

    On construction every field is checked against its annotation (:func:`coerce_option`;
    ints become floats for float fields, lists become tuples), then against its declared range
    (``Annotated[int, Ge(2)]``, annotated-types), then :meth:`validate` runs, then the sizes of
    :meth:`footprint` are checked against :data:`ELEMENT_BUDGET`.

    ``range_reasons`` (a class attribute) says why a range is what it is, where the mathematics
    sets it (β > 0 where a law assumes it): the error of a value outside it gives the reason.
    """

    range_reasons: typing.ClassVar[dict[str, str]] = {}

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        values = {}
        for name, value in vars(self).items():
            values[name] = coerce_option(None, name, hints[name], value)
            object.__setattr__(self, name, values[name])
        _check_bounds(values, option_bounds(type(self)), self.range_reasons)
        self.validate()
        _check_footprint(self)

    def validate(self) -> None:
        """The experiment's own checks: those between options, and ranges that depend on
        another option."""

    def footprint(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """The run's largest arrays, known from the options before the run: what each holds ->
        its axes as (name, length) pairs (:func:`sizes` makes them from option names). Checked
        against :data:`ELEMENT_BUDGET` on construction, so a run that could not be held in memory
        is refused before its directory is made, naming the options that size it. The base
        declares none."""
        return {}


# ----------------------------------------------------------------------------- size budget

ELEMENT_BUDGET = 2**31
"""The most elements one array of a run may hold: 8 GiB in float32, 16 GiB in float64 (a
run's largest array, as :meth:`Options.footprint` declares it). A run beyond it would exhaust
the memory of the machines the experiments are sized for, after minutes of work."""


def sizes(cfg, *axes) -> tuple[tuple[str, int], ...]:
    """The axes of an array for :meth:`Options.footprint`: an option name (a list option counts
    its items; a property such as ``num_layers`` its value) or an explicit ``(label, length)``."""
    out = []
    for axis in axes:
        if isinstance(axis, tuple):
            out.append((axis[0], int(axis[1])))
        else:
            value = getattr(cfg, axis)
            out.append((axis, len(value) if isinstance(value, tuple) else int(value)))
    return tuple(out)


def _check_footprint(cfg) -> None:
    """Raise naming the options when an array of :meth:`Options.footprint` exceeds the budget."""
    fields = {f.name for f in dataclasses.fields(cfg)}
    for what, axes in cfg.footprint().items():
        elements = math.prod(n for _, n in axes)  # a Python int: no overflow
        if elements > ELEMENT_BUDGET:
            names = " × ".join(label for label, _ in axes)
            values = " × ".join(str(n) for _, n in axes)
            # the options named in the labels ("min(n, max_tokens_saved)" names two)
            options = list(dict.fromkeys(w for label, _ in axes for w in re.findall(r"[A-Za-z_]\w*", label)
                                         if w in fields))
            lower = f"; lower {' or '.join(options)}" if options else ""
            raise ValueError(f"the run would hold {what} of {names} = {values} = {elements:.3g} elements, "
                             f"above the budget of 2**31 elements (8 GiB in float32){lower}")


# ----------------------------------------------------------------------------- checks in validate()


def require_at_least(cfg, **bounds) -> None:
    """Every value of each named option (each item of a list) is >= its bound, for ranges that
    depend on other options: ``require_at_least(self, d=2 if sphere else 1)``."""
    _check_bounds(dataclasses.asdict(cfg), {k: (at.Ge(b),) for k, b in bounds.items()})


__all__ = ["COMMON_HELP", "ELEMENT_BUDGET", "FLOAT32_MAX", "FLOAT32_TINY", "Options", "coerce_option",
           "describe_range", "format_value", "list_item_type", "option_bounds", "option_docs", "parse_option_text",
           "require_at_least", "sizes", "type_name"]
