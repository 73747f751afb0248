"""Shared test helpers: tiny models and hand-made federated data."""

import atexit
import os
import shutil
import tempfile

# The suite's programs are tiny, so most of its time is XLA:CPU compiling
# them.  It compiles with the settings that compile fastest, measured on a
# MultiSFL round: LLVM at -O1 instead of XLA's default -O3, and XLA's
# elemental fusion emitters instead of its MLIR ones, 45% less time in the
# MultiSFL equivalence tests (tests/README.md, "What a test costs").  The
# HLO, and so what a program computes, is the same; the kernels differ in
# their float rounding only.  JSFL_TEST_XLA=default runs the suite as users'
# programs compile; an XLA_FLAGS set beforehand is left alone.  The test
# that guards a miscompile seen at the defaults compiles with them
# explicitly (DEFAULT_XLA).  A jaxlib whose XLA lacks a flag runs without it.
FAST_XLA = ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false")


def _xla_knows(flags):
  """Whether this jaxlib's XLA accepts ``flags``: an unknown flag in
  ``XLA_FLAGS`` aborts every process."""
  import subprocess
  import sys
  env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                        capture_output=True).returncode == 0


# Chosen once, by pytest or xdist's controller (its workers inherit both
# variables): both settings, else the LLVM level alone, else XLA's defaults.
if "XLA_FLAGS" not in os.environ:
  _chosen = ()
  if os.environ.get("JSFL_TEST_XLA", "fast") != "default":
    _chosen = next((f for f in (FAST_XLA, FAST_XLA[:1]) if _xla_knows(f)), ())
  os.environ["JSFL_TEST_XLA_FLAGS"] = " ".join(_chosen)


def xla_flags(devices=1):
  """The suite's ``XLA_FLAGS`` with ``devices`` simulated CPU devices, for
  the tests that start processes of their own."""
  return " ".join(filter(None, (f"--xla_force_host_platform_device_count={devices}",
                                os.environ.get("JSFL_TEST_XLA_FLAGS", ""))))


os.environ.setdefault("XLA_FLAGS", xla_flags())
# XLA's defaults for what the suite changed, as compiler options of one program.
DEFAULT_XLA = {k: v for k, v in (("xla_backend_optimization_level", 3),
                                 ("xla_cpu_use_fusion_emitters", True))
               if f"--{k}=" in os.environ.get("JSFL_TEST_XLA_FLAGS", "")}
# One persistent compilation cache for the whole session, as a user's runs
# have by default: the resume, sweep and subprocess tests compile the same
# programs again and again.  The process that makes it (pytest, or xdist's
# controller, whose workers inherit the variable) removes it at exit; a
# JSFL_COMPILE_CACHE set beforehand (``off`` included) is left alone.
if "JSFL_COMPILE_CACHE" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="jsfl-tests-xla-")
  os.environ["JSFL_COMPILE_CACHE"] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import importlib.util  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jsfl.train import compile_cache  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# In this process too, before anything compiles (JAX settles the cache at
# its first compilation).
compile_cache.enable()

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(relpath, name=None):
  """A script outside the package (``experiments/.../x.py``: relative to the
  repository root, or absolute) imported as a module, for tests of the
  recipes beside it."""
  path = ROOT / relpath
  spec = importlib.util.spec_from_file_location(name or path.stem, path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def compiled_rounds(cfg, rounds, compiler_options=None):
  """``(state, [metrics of each round])`` after ``rounds`` of a resolved
  config's round program over its slots, built as ``jsfl run`` builds it;
  ``compiler_options`` compile it explicitly (``DEFAULT_XLA``: as users'
  runs compile)."""
  from jsfl.train import experiment, programs
  exp = experiment.prepare(cfg)
  init, rnd, _ = programs.build_programs(exp)
  seed_data, shared = programs.split_data(exp.data)
  keys = programs.make_seed_keys(exp.seeds)
  state, metrics = init(keys), []
  if compiler_options is not None:
    rnd = rnd.lower(state, seed_data, programs.round_keys(keys, 0),
                    shared).compile(compiler_options)
  for r in range(rounds):
    state, m = rnd(state, seed_data, programs.round_keys(keys, r), shared)
    metrics.append(m)
  return state, metrics


def make_fed_data(sizes, num_classes=4, shape=(8, 8, 1), seed=0, dominant=None):
  """Random uint8 images, labels and a client index table with ``sizes``."""
  rng = np.random.default_rng(seed)
  n = int(sum(sizes))
  x = rng.integers(0, 256, (n,) + tuple(shape), dtype=np.uint8)
  y = rng.integers(0, num_classes, n).astype(np.int32)
  max_n = max(sizes)
  table = np.zeros((len(sizes), max_n), np.int32)
  start = 0
  for c, s in enumerate(sizes):
    table[c, :s] = np.arange(start, start + s)
    start += s
  counts = np.stack([np.bincount(y[table[c, :s]], minlength=num_classes)
                     for c, s in enumerate(sizes)]).astype(np.int32)
  if dominant is None:
    dominant = counts.argmax(1).astype(np.int32)
  from jsfl.core.data import RoundData
  return RoundData(x=jnp.asarray(x), y=jnp.asarray(y),
                   mean=jnp.full((shape[-1],), 0.5, jnp.float32),
                   std=jnp.full((shape[-1],), 0.25, jnp.float32),
                   table=jnp.asarray(table), sizes=jnp.asarray(np.array(sizes, np.int32)),
                   dominant=jnp.asarray(dominant), counts=jnp.asarray(counts))


@pytest.fixture
def fed_data():
  return make_fed_data([13, 7, 20, 5])


# ------------------------------------------------ where the suite's time goes
# JSFL_TEST_COMPILE_LOG=PREFIX: every worker writes PREFIX.<worker>.json, per
# test the seconds XLA spent compiling in this process and the programs the
# persistent cache served; `python tests/compile_census.py PREFIX` adds them
# up.  Removing a test saves only the programs no other test compiles.
_COMPILE_LOG = os.environ.get("JSFL_TEST_COMPILE_LOG")
_compile_by_test: dict = {}
_current_test = ["(collection)"]

if _COMPILE_LOG:
  from jax import monitoring as _monitoring
  from jax._src import dispatch as _dispatch

  def _entry():
    return _compile_by_test.setdefault(_current_test[0], {"compile_s": 0.0, "compiles": 0,
                                                          "cache_hits": 0, "saved_s": 0.0})

  def _on_duration(event, duration, **_):
    if event == _dispatch.BACKEND_COMPILE_EVENT:
      e = _entry()
      e["compile_s"] += duration
      e["compiles"] += 1
    elif event == "/jax/compilation_cache/compile_time_saved_sec":
      _entry()["saved_s"] += duration

  def _on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
      _entry()["cache_hits"] += 1

  _monitoring.register_event_duration_secs_listener(_on_duration)
  _monitoring.register_event_listener(_on_event)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  _current_test[0] = item.nodeid
  try:
    return (yield)
  finally:
    _current_test[0] = "(between tests)"


def pytest_sessionfinish(session):
  if _COMPILE_LOG and _compile_by_test:
    import json
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{_COMPILE_LOG}.{worker}.json", "w") as f:
      json.dump(_compile_by_test, f, indent=0)
