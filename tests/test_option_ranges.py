"""Every method option declares what it allows, and the config layer enforces it.

Config only: nothing is trained, and no method module is imported.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from jsfl import config, options
from jsfl.methods import catalog
from jsfl.methods.catalog import METHODS, get_method

# Int/float options allowed to have no declared range, each with the reason
# (any finite value, and ints within int32, must then be meaningful).
NO_RANGE: dict[tuple[str, str], str] = {}

ALL = [(name, key, opt) for name in METHODS
       for key, opt in config.method_options(name).items()]
NUMERIC = [(name, key, opt) for name, key, opt in ALL if opt.type in (int, float)]
RANGED = [(name, key, opt) for name, key, opt in NUMERIC if opt.range is not None]


def _ids(cases):
  return [f"{name}.{key}" for name, key, _ in cases]


def _load(name: str, key: str, value):
  # repr of an int or a finite float is valid TOML (1e-05, -5e-324, 0.0).
  return config.load_config(None, [f"method.name={name}", f"method.{key}={value!r}"])


def _bound_cases():
  """(name, key, value, accepted) for each finite bound of every range."""
  cases = []
  for name, key, opt in RANGED:
    lo, hi, lo_closed, hi_closed = options._bounds(opt.range)
    for bound, closed, inward in ((lo, lo_closed, math.inf), (hi, hi_closed, -math.inf)):
      if math.isinf(bound):
        continue
      if opt.type is int:
        step = 1 if inward > 0 else -1
        first_in = int(bound) if closed else int(bound) + step
        cases += [(name, key, first_in, True), (name, key, first_in - step, False)]
      else:
        first_in = bound if closed else math.nextafter(bound, inward)
        first_out = math.nextafter(bound, -inward) if closed else bound
        cases += [(name, key, first_in, True), (name, key, first_out, False)]
  return cases


BOUNDS = _bound_cases()


def test_cases_cover_every_option():
  assert NUMERIC, "no numeric method options found"
  # every declared range has a finite bound, so each gets its boundary checked
  assert {(n, k) for n, k, *_ in BOUNDS} == {(n, k) for n, k, _ in RANGED}
  # the allowlist names real options, each with a reason
  assert all(reason for reason in NO_RANGE.values())
  assert set(NO_RANGE) <= {(n, k) for n, k, _ in NUMERIC}


@pytest.mark.parametrize("name,key,opt", ALL, ids=_ids(ALL))
def test_default_is_allowed(name, key, opt):
  assert options.check(f"method.{key}", opt.default, opt) == opt.default
  if opt.choices is not None:
    assert opt.default in opt.choices


@pytest.mark.parametrize("name,key,opt", NUMERIC, ids=_ids(NUMERIC))
def test_numeric_option_declares_range(name, key, opt):
  if (name, key) in NO_RANGE:
    return
  assert opt.range is not None, (
      f"{name}: method.{key} ({opt.type.__name__}) declares no range; declare one in "
      f"its option set or list it with a reason in NO_RANGE")
  lo, hi, *_ = options._bounds(opt.range)   # parses
  assert lo < hi


@pytest.mark.parametrize("name,key,opt", ALL, ids=_ids(ALL))
def test_nan_is_a_config_error(name, key, opt):
  with pytest.raises(config.ConfigError, match=f"method\\.{key}"):
    config.load_config(None, [f"method.name={name}", f"method.{key}=nan"])


@pytest.mark.parametrize("name,key,value,accepted", BOUNDS,
                         ids=[f"{n}.{k}={v!r}" for n, k, v, _ in BOUNDS])
def test_range_bounds(name, key, value, accepted):
  if accepted:
    cfg = _load(name, key, value)
    assert cfg["method"][key] == value
  else:
    with pytest.raises(config.ConfigError, match=f"method\\.{key}="):
      _load(name, key, value)


@pytest.mark.parametrize("name,override", [
    ("fedprox", "method.mu=-1"),
    ("sfedkd", "method.temperature=0"),
    ("sfedkd", "method.temperature=-4.0"),
    ("fedntd", "method.tau=0"),
    ("sfl_fedntd", "method.tau=0.0"),
    ("multisfl", "method.gamma=1"),
    ("multisfl", "method.p_max=1.5"),
    ("sfl_fedexp", "method.eps=0"),
    ("sfl_fedmut", "method.bound=0"),
    ("cwc", "method.sigma=2"),
    ("sfedkd", "method.num_teachers=-1"),
    ("hydra", "method.head_cut=-2"),
])
def test_hostile_values_rejected(name, override):
  with pytest.raises(config.ConfigError, match=override.split("=")[0].replace(".", r"\.")):
    config.load_config(None, [f"method.name={name}", override])


@pytest.mark.parametrize("name,override", [
    ("fedprox", "method.mu=0.0"),          # FedAvg (experiments/sequential)
    ("hydra", "method.head_cut=-1"),
    ("hydra", "method.groups=0"),
    ("sfedkd", "method.num_teachers=0"),   # FedSeq
    ("multisfl", "method.p0=0"),
])
def test_sentinels_accepted(name, override):
  config.load_config(None, [f"method.name={name}", override])


# --------------------------------------------------- static vs batchable
def test_only_float_scalars_are_batchable():
  """Ints (counts, windows, cuts), strings (choices) and bools (switches)
  change the program; only float scalars may be batchable."""
  schema = [(f"[{sec}]", key, opt) for sec, fields in config.SCHEMA.items()
            for key, opt in fields.items()]
  for name, key, opt in ALL + schema:
    if opt.batchable:
      assert opt.type is float, f"{name}.{key} is batchable but a {opt.type.__name__}"


@pytest.mark.parametrize(("name", "key", "batchable"), [
    ("fedprox", "mu", True), ("sfedkd", "temperature", True), ("multisfl", "gamma", True),
    ("multisfl", "alpha", True), ("sfl_smooth", "smoothing", True),
    # sizes the static replay buffer
    ("multisfl", "p_max", False), ("multisfl", "p0", False),
    ("hydra", "groups", False), ("sfedkd", "num_teachers", False),
    ("multisfl", "clp_window", False),
])
def test_batchable_declarations(name, key, batchable):
  assert config.method_options(name)[key].batchable is batchable


def test_optimiser_scalars():
  """lr and its schedule are injected values; momentum and weight decay
  switch optax transforms on or off, so they are static."""
  optim = config.SCHEMA["optim"]
  assert [k for k, o in optim.items() if o.batchable] == ["lr", "lr_decay", "lr_min"]


# ------------------------------------------------------------ option sets
def test_schema_and_docs_need_no_jax():
  """The catalog lists every option set as data, so config checks and the
  config reference never import a method module (nor JAX)."""
  code = ("import sys; from jsfl import config; "
          "config.load_config(None, ['method.name=multisfl', 'method.gamma=0.3']); "
          "config.markdown_reference(); "
          "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_option_set_is_typed_and_static():
  Smooth = get_method("sfl_smooth").options
  assert Smooth().smoothing == 0.1                                  # defaults
  given = Smooth(smoothing=0.2)
  with pytest.raises(TypeError, match="smoothing_eps"):
    Smooth(smoothing_eps=0.3)                                       # a typo is not ignored
  with pytest.raises(dataclasses.FrozenInstanceError):
    given.smoothing = 0.5
  assert hash(given) == hash(Smooth(smoothing=0.2))                # static in a jit closure


def test_static_setup_holds_no_batchable_value():
  """A program closes over Setup.static(): reading a batchable value from it
  fails while tracing instead of using one slot's value for every slot; the
  slot's values travel in data.hyper."""
  from jsfl.core.data import hyper_of
  from jsfl.core.setup import Setup
  Smooth = get_method("sfl_smooth").options
  Prox = get_method("cwc").options
  setup = Setup(model=None, num_clients=2, clients_per_round=2, max_size=4, lr=0.3,
                options=Prox(lam=0.7, sigma=0.2, fisher="sample"))
  static = setup.static()
  assert static.lr is static.lr_decay is static.lr_min is None
  assert static.options.lam is None and static.options.sigma is None
  assert static.options.fisher == "sample"                          # static options stay
  h = hyper_of(setup)
  assert (h.lr, h.method.lam, h.method.sigma) == (0.3, 0.7, 0.2)
  import jax
  leaves, treedef = jax.tree.flatten(h)
  assert sorted(leaves) == sorted([0.3, 1.0, 0.0, 0.7, 0.2])       # the batchable values
  assert jax.tree.unflatten(treedef, leaves).method.fisher == "sample"
  assert Smooth().smoothing == 0.1


def test_option_set_declarations_are_checked():
  with pytest.raises(TypeError, match="declare it with"):
    @options.option_set
    class Bare:
      x: float = 1.0
  with pytest.raises(TypeError, match="allowed: int, float, str, bool"):
    @options.option_set
    class Listy:
      xs: list = options.option((), "a list")


def test_catalog_is_current():
  """The catalog says what the method modules define: every METHOD's option
  set, field for field (``python -m jsfl.methods.catalog --write`` after a
  change)."""
  assert catalog.discover() == METHODS, (
      "jsfl/methods/catalog.py is stale: run python -m jsfl.methods.catalog --write")
  for name, entry in METHODS.items():
    assert options.is_option_set(get_method(name).options), name
