"""Shared test helpers: tiny models and hand-made federated data."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# Tests compile what they test; the persistent cache has its own test
# (test_observe.py) with its own directory.
os.environ.setdefault("JSFL_COMPILE_CACHE", "off")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


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
