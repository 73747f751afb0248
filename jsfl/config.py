"""Run configuration: TOML files plus ``section.key=value`` overrides.

Configs are data (big_vision style): a TOML file with the sections below,
every key optional.  :func:`load_config` resolves defaults, applies command
line overrides and validates everything before anything runs; a bad key,
type or value raises :class:`ConfigError` with one line naming it and what is
allowed.  ``docs/config.md`` is generated from :data:`SCHEMA`
(``python -m jsfl.config``).

Example::

  [run]
  rounds = 20
  seeds = 5
  [dataset]
  name = "fashion_mnist"
  [partition]
  name = "dominant_label"
  num_clients = 10
  p = 0.8
  [model]
  name = "small_cnn"
  [method]
  name = "sfl"
  order = "cyclic"
  [optim]
  lr = 0.05
  lr_decay = 0.993
  lr_min = 0.005
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from typing import Any

from jsfl.methods.registry import METHODS

Field = tuple  # (type, default, help, choices-or-None)


class ConfigError(ValueError):
  """A config key, type or value that is not allowed (CLI exit code 2)."""


def _f(typ, default, help_, choices=None):
  return (typ, default, help_, choices)


# Sections whose extra keys are forwarded as options (validated by the owner:
# the dataset loader, the partition family, the model factory, the method).
OPEN_SECTIONS = ("dataset", "partition", "model", "method")

SCHEMA: dict[str, dict[str, Field]] = {
    "run": {
        "name": _f(str, "run", "run name; the run directory is out_dir/name-TIMESTAMP"),
        "out_dir": _f(str, "runs", "parent directory of run directories"),
        "dir": _f(str, "", "exact run directory (overrides out_dir/name)"),
        "rounds": _f(int, 20, "training rounds R"),
        "eval_every": _f(int, 1, "evaluate every this many rounds (and after the last)"),
        "seeds": _f(int, 1, "seeds run together in one compiled program (vmap)"),
        "seed": _f(int, 0, "first seed; seed s uses seed + s for init, partition, sampling, order"),
        "checkpoint_every": _f(int, 10, "checkpoint (RUN_DIR/checkpoints, last 2 kept) every "
                               "this many rounds and after the last; 0 = only at the end "
                               "and on SIGTERM / SIGINT (resume: jsfl run --resume RUN_DIR)"),
    },
    "dataset": {
        "name": _f(str, "fashion_mnist", "dataset",
                   ("fashion_mnist", "mnist", "cifar10", "cifar100", "svhn", "synthetic")),
        "data_dir": _f(str, "", "directory holding the dataset files (optional)"),
        "download": _f(bool, True, "allow downloading into the cache dir when online"),
    },
    "partition": {
        "name": _f(str, "iid", "partition family (SPEC 1.1)",
                   ("iid", "dirichlet", "dominant_label", "sharding", "exdir", "natural")),
        "num_clients": _f(int, 10, "clients K"),
    },
    "model": {
        "name": _f(str, "small_cnn", "model"),
        "cut": _f(int, -1, "part-1 / part-2 cut index; -1 = the model's default"),
        "norm": _f(str, "", "normalisation; '' = the model's default", ("", "batch", "group", "none")),
        "conv_impl": _f(str, "auto", "dense conv lowering", ("auto", "xla", "im2col")),
        "depthwise_impl": _f(str, "auto", "depthwise conv lowering", ("auto", "grouped", "shifts")),
    },
    "method": {
        "name": _f(str, "sfl", "method", tuple(METHODS)),
        "order": _f(str, "random", "server processing order (SPEC 1.2)",
                    ("random", "cyclic", "cyclic_reverse", "fixed")),
        "clients_per_round": _f(int, 0, "participants n per round; 0 = all K"),
        "local_epochs": _f(int, 1, "local epochs E per round"),
        "batch_size": _f(int, 64, "batch size B"),
    },
    "optim": {
        "lr": _f(float, 0.05, "learning rate"),
        "lr_decay": _f(float, 1.0, "multiplied into lr once per round"),
        "lr_min": _f(float, 0.0, "floor of the decayed lr"),
        "momentum": _f(float, 0.0, "SGD momentum"),
        "weight_decay": _f(float, 0.0, "SGD weight decay (PyTorch semantics)"),
    },
    "exec": {
        "client_exec": _f(str, "vmap", "how the clients' portions run in one program",
                          ("vmap", "map", "unroll")),
        "seed_exec": _f(str, "auto", "how the seed axis runs in one program; auto = the "
                        "measured default of the backend (runner.default_seed_exec)",
                        ("auto", "vmap", "map")),
        "server_unroll": _f(int, 1, "unroll factor of the server lax.scan"),
        "mesh": _f(str, "auto", "device mesh 'seeds=S,clients=C' (jsfl.engine.sharding); "
                   "auto = the devices that divide run.seeds, then the clients per round"),
        "eval_batch": _f(int, 1000, "test samples per evaluation chunk"),
        "progress": _f(bool, True, "show a progress bar"),
    },
}


def defaults() -> dict[str, dict[str, Any]]:
  return {s: {k: v[1] for k, v in fields.items()} for s, fields in SCHEMA.items()}


def _type_name(t) -> str:
  return {int: "an int", float: "a float", str: "a string", bool: "true/false"}[t]


def _check_value(where: str, value, field: Field):
  typ, _, _, choices = field
  if typ is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
  if not ok:
    raise ConfigError(f"{where}={value!r}: wrong type; allowed: {_type_name(typ)}")
  if choices is not None and value not in choices:
    raise ConfigError(f"{where}={value!r}; allowed: {', '.join(map(repr, choices))}")
  return value


def _unknown(where: str, key: str, allowed) -> ConfigError:
  near = difflib.get_close_matches(key, list(allowed), n=1)
  hint = f" (did you mean {near[0]!r}?)" if near else ""
  return ConfigError(f"unknown config key {where!r}{hint}; allowed: "
                     + ", ".join(sorted(allowed)))


def parse_override(text: str) -> tuple[str, str, Any]:
  """``section.key=value`` -> (section, key, value); value parsed as TOML."""
  if "=" not in text or "." not in text.split("=", 1)[0]:
    raise ConfigError(f"override {text!r}: expected section.key=value, "
                      f"e.g. method.order=cyclic")
  lhs, raw = text.split("=", 1)
  section, key = lhs.strip().split(".", 1)
  try:
    value = tomllib.loads(f"v = {raw}")["v"]
  except tomllib.TOMLDecodeError:
    value = raw
  return section, key.strip(), value


def load_config(path: str | None = None, overrides: list[str] = ()) -> dict:
  """Reads, merges, and validates a config.

  Args:
    path: a TOML file, or None for the defaults.
    overrides: ``section.key=value`` strings applied after the file.

  Returns:
    The fully resolved config (every section, every known key).

  Raises:
    ConfigError: naming the first bad key, type or value.
  """
  raw: dict = {}
  if path:
    try:
      with open(path, "rb") as f:
        raw = tomllib.load(f)
    except FileNotFoundError:
      raise ConfigError(f"config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
      raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
  raw = copy.deepcopy(raw)
  for o in overrides:
    s, k, v = parse_override(o)
    raw.setdefault(s, {})
    if not isinstance(raw[s], dict):
      raise ConfigError(f"config section {s!r} must be a table")
    raw[s][k] = v
  cfg = defaults()
  for section, values in raw.items():
    if section not in SCHEMA:
      raise _unknown(section, section, SCHEMA)
    if not isinstance(values, dict):
      raise ConfigError(f"config section {section!r} must be a table, got {values!r}")
    for key, value in values.items():
      where = f"{section}.{key}"
      if key in SCHEMA[section]:
        cfg[section][key] = _check_value(where, value, SCHEMA[section][key])
      elif section in OPEN_SECTIONS:
        cfg[section][key] = value  # validated by its owner in validate_options
      else:
        raise _unknown(where, key, SCHEMA[section])
  _check_ranges(cfg)
  _check_method_options(cfg)
  return cfg


def _check_method_options(cfg):
  """Method-specific keys of [method] against the method's ``OPTIONS``."""
  from jsfl.methods.base import get_method
  options = getattr(get_method(cfg["method"]["name"]), "OPTIONS", {})
  for key in extra_options(cfg, "method"):
    if key not in options:
      raise _unknown(f"method.{key}", key, set(SCHEMA["method"]) | set(options))
    typ, default, *rest = options[key]
    choices = rest[1] if len(rest) > 1 else None
    cfg["method"][key] = _check_value(f"method.{key}", cfg["method"][key],
                                      (typ, default, "", choices))
  for key, (_typ, default, *_rest) in options.items():
    cfg["method"].setdefault(key, default)


def _positive(cfg, section, key, low=1):
  v = cfg[section][key]
  if v < low:
    raise ConfigError(f"{section}.{key}={v!r}; allowed: an int >= {low}")


def _check_ranges(cfg):
  for s, k in (("run", "rounds"), ("run", "eval_every"), ("run", "seeds"),
               ("partition", "num_clients"), ("method", "local_epochs"),
               ("method", "batch_size"), ("exec", "server_unroll"),
               ("exec", "eval_batch")):
    _positive(cfg, s, k)
  _positive(cfg, "run", "seed", 0)
  _positive(cfg, "run", "checkpoint_every", 0)
  n, k = cfg["method"]["clients_per_round"], cfg["partition"]["num_clients"]
  if not 0 <= n <= k:
    raise ConfigError(f"method.clients_per_round={n!r}; allowed: 0 (all) or an "
                      f"int in [1, partition.num_clients={k}]")
  o = cfg["optim"]
  if o["lr"] <= 0:
    raise ConfigError(f"optim.lr={o['lr']!r}; allowed: a float > 0")
  if not 0 < o["lr_decay"] <= 1:
    raise ConfigError(f"optim.lr_decay={o['lr_decay']!r}; allowed: a float in (0, 1]")
  for key in ("lr_min", "momentum", "weight_decay"):
    if o[key] < 0:
      raise ConfigError(f"optim.{key}={o[key]!r}; allowed: a float >= 0")
  if o["momentum"] >= 1:
    raise ConfigError(f"optim.momentum={o['momentum']!r}; allowed: a float in [0, 1)")


def extra_options(cfg: dict, section: str) -> dict:
  """The keys of an open section that are not in its schema (owner options)."""
  return {k: v for k, v in cfg[section].items() if k not in SCHEMA[section]}


def markdown_reference() -> str:
  """The config reference as markdown, generated from :data:`SCHEMA`."""
  lines = ["# Config reference", "",
           "Generated from `jsfl.config.SCHEMA` (`python -m jsfl.config`).", ""]
  for section, fields in SCHEMA.items():
    lines += [f"## [{section}]", "", "| key | type | default | allowed | meaning |",
              "| --- | --- | --- | --- | --- |"]
    for k, (t, d, h, ch) in fields.items():
      allowed = ", ".join(f"`{c!r}`" for c in ch) if ch else ""
      lines.append(f"| `{k}` | {t.__name__} | `{d!r}` | {allowed} | {h} |")
    if section in OPEN_SECTIONS:
      lines += ["", (f"Other keys in `[{section}]` are passed as options to the "
                     f"chosen {section} and validated by it.")]
    lines.append("")
  return "\n".join(lines + _method_options_reference())


def _method_options_reference() -> list[str]:
  """One table per method with its own ``[method]`` keys (module ``OPTIONS``)."""
  from jsfl.methods.base import get_method
  lines = ["## Method options", "",
           ("Keys under `[method]` that only one method reads (its module's "
           "`OPTIONS`), checked when `method.name` selects it."), ""]
  for name in METHODS:
    options = getattr(get_method(name), "OPTIONS", {})
    if not options:
      continue
    lines += [f"### `method.name = \"{name}\"`", "",
              "| key | type | default | allowed | meaning |",
              "| --- | --- | --- | --- | --- |"]
    for k, (t, d, h, *rest) in options.items():
      allowed = ", ".join(f"`{c!r}`" for c in rest[0]) if rest and rest[0] else ""
      lines.append(f"| `{k}` | {t.__name__} | `{d!r}` | {allowed} | {h} |")
    lines.append("")
  return lines


if __name__ == "__main__":
  print(markdown_reference())
