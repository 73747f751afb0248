"""Typed options with declared ranges: one check for every config value.

A config key and a method option are both an :class:`Option`: its type,
default, help text, and what is allowed, as ``choices`` or as an interval
``range`` written the way it reads in an error message and in
``docs/config.md`` (``"(0, 1]"``, ``"[0, inf)"``).  :func:`check` is the one
place a value is accepted or rejected: wrong type, a non-finite float (TOML
spells ``nan`` and ``inf``), a value outside the interval or the choices, an
int too large for the arrays it ends up in.

A method's own options are an *option set* (:func:`option_set`): a frozen
dataclass whose fields are declared with :func:`option`; the config schema,
its checks and the docs read their Options through :func:`options_of`.

Importable without JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

INT32_MAX = 2**31 - 1


class Option(NamedTuple):
  """One option: ``type``, ``default``, ``help``, and what is allowed.

  ``choices``: the allowed values (strings), or None.  ``range``: an
  interval such as ``"[0, 1)"`` or ``"(0, inf)"`` for ints and floats, or
  None for any finite value (ints are always within int32).

  ``item``: for ``type = list``, the type of its items; ``choices`` and
  ``range`` then constrain every item (a list option is never batchable).
  A list of strings may also be given as one comma-separated string.

  ``batchable``: the value is a scalar that only enters the round's
  arithmetic (a learning rate, a loss weight, a temperature), so it reaches
  the round as a traced per-slot value and runs that differ in it share one
  compiled program (:mod:`jsfl.slots`); a round must never branch on it in
  Python (checks belong in the method's host-side ``validate``).  False
  (static) for values that change the program: choices, counts, cut
  indices, window lengths, bounds that size a buffer, and anything that
  switches a term on or off.
  """

  type: type
  default: Any
  help: str
  choices: tuple | None = None
  range: str | None = None
  batchable: bool = False
  item: Any = None  # a type (the field ``type`` shadows the builtin here)


def _bounds(spec: str):
  """``"[a, b)"`` -> (a, b, a_closed, b_closed) with floats (inf allowed)."""
  spec = spec.strip()
  lo_c, hi_c = spec[0] == "[", spec[-1] == "]"
  if spec[0] not in "[(" or spec[-1] not in "])":
    raise ValueError(f"bad range {spec!r}")
  lo, hi = (float(s) for s in spec[1:-1].split(","))
  return lo, hi, lo_c, hi_c


def in_range(value, spec: str) -> bool:
  lo, hi, lo_c, hi_c = _bounds(spec)
  above = value >= lo if lo_c else value > lo
  below = value <= hi if hi_c else value < hi
  return bool(above and below)


def _num(x: float, typ) -> str:
  return str(int(x)) if typ is int or x == int(x) else repr(x)


def type_name(t) -> str:
  return {int: "an int", float: "a float", str: "a string", bool: "true/false",
          list: "a list"}[t]


def allowed(opt: Option) -> str:
  """What is allowed, as the error messages and the docs say it."""
  if opt.type is list:
    if opt.choices is not None:
      return "a list of " + ", ".join(map(repr, opt.choices))
    return f"a list, each item {allowed(opt._replace(type=opt.item or str, item=None))}"
  if opt.choices is not None:
    return ", ".join(map(repr, opt.choices))
  if opt.type in (int, float):
    spec = opt.range or ("[-2147483648, 2147483647]" if opt.type is int else None)
    if spec is None:
      return "a finite float"
    lo, hi, lo_c, _ = _bounds(spec)
    if hi == math.inf:  # "an int >= 1" reads better than "an int in [1, inf)"
      return f"{type_name(opt.type)} {'>=' if lo_c else '>'} {_num(lo, opt.type)}"
    return f"{type_name(opt.type)} in {spec}"
  return type_name(opt.type)


def check(where: str, value, opt: Option, error=ValueError):
  """``value`` if ``opt`` allows it (ints widened to floats where a float is
  asked for), else raises ``error`` with one line naming ``where``."""
  typ = opt.type
  if typ is list:
    if isinstance(value, str) and opt.item in (str, None):  # "a,b" from a command line
      value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
      raise error(f"{where}={value!r}: wrong type; allowed: {allowed(opt)}")
    scalar = opt._replace(type=opt.item or str, item=None)
    for v in value:
      try:
        check(where, v, scalar, error)
      except error:
        raise error(f"{where}={value!r} (item {v!r}); allowed: {allowed(opt)}") from None
    return [v if opt.item is not float else float(v) for v in value]
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
    raise error(f"{where}={value!r}: wrong type; allowed: {type_name(typ)}")
  if opt.choices is not None and value not in opt.choices:
    raise error(f"{where}={value!r}; allowed: {allowed(opt)}")
  if typ is float and not math.isfinite(value):  # type: ignore[arg-type]
    raise error(f"{where}={value!r}; allowed: {allowed(opt)}")
  if typ is int and not -INT32_MAX - 1 <= value <= INT32_MAX:  # type: ignore[operator]
    raise error(f"{where}={value!r}; allowed: {allowed(opt)}"
                + ("" if opt.range else " (int32)"))
  if typ in (int, float) and opt.range is not None and not in_range(value, opt.range):
    raise error(f"{where}={value!r}; allowed: {allowed(opt)}")
  return value


# ------------------------------------------------------------ option sets
# A method's options are one frozen dataclass (an *option set*): a field per
# ``[method]`` key, its type from the annotation and the rest of its Option
# from :func:`option`.  Frozen and made of scalars, an instance is hashable,
# so it can sit in the static ``Setup`` a round closes over.

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def option(default, help: str, *, choices: tuple | None = None, range: str | None = None,
           batchable: bool = False):
  """One field of an option set: its default and the rest of its
  :class:`Option` (the type is the field's annotation)."""
  meta = {"help": help, "choices": choices, "range": range, "batchable": batchable}
  return dataclasses.field(default=default, metadata={"jsfl.option": meta})


def option_set(cls):
  """Makes ``cls`` a frozen dataclass of options, each field from
  :func:`option` (a run's ``Setup.options`` is an instance)."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  for f in dataclasses.fields(cls):
    if "jsfl.option" not in f.metadata:
      raise TypeError(f"{cls.__name__}.{f.name}: declare it with jsfl.options.option()")
    if f.type not in _SCALARS and f.type not in _SCALARS.values():
      raise TypeError(f"{cls.__name__}.{f.name}: type {f.type!r}; allowed: int, float, "
                      "str, bool")
  cls.__option_set__ = True
  return cls


def is_option_set(cls) -> bool:
  """Whether ``cls`` was made by :func:`option_set`."""
  return getattr(cls, "__option_set__", False) is True


def options_of(cls) -> dict[str, Option]:
  """The :class:`Option` of every field of option set ``cls``, in order."""
  out = {}
  for f in dataclasses.fields(cls):
    typ: Any = _SCALARS.get(f.type, f.type) if isinstance(f.type, str) else f.type
    out[f.name] = Option(typ, f.default, **f.metadata["jsfl.option"])
  return out


@option_set
class NoOptions:
  """The option set of a method without options of its own."""

  def __getattr__(self, name: str):
    # A Setup built by hand for a method with options, without them.
    raise AttributeError(
        f"option {name!r} read from NoOptions(); build the Setup with the "
        "method's option set, e.g. Setup(..., options=method.options())")
