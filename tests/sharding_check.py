"""Run by tests/test_sharding.py in a fresh process with 8 simulated CPU
devices: each method's rounds on one device and on a (seeds x clients) mesh
of all 8, printing one JSON line per method with the largest difference."""

import json
import os
import sys

# test_sharding.py passes the suite's flags with the same device count.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np

jax.config.update("jax_default_matmul_precision", "highest")

from jsfl import config as config_lib
from jsfl import train
from jsfl.train.programs import (
  build_programs,
  make_seed_keys,
  place,
  round_keys,
  run_mesh,
  split_data,
)

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=240", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "exec.progress=false", "run.seeds=2", "partition.num_clients=8",
       "method.clients_per_round=4", "method.batch_size=16"]
EXTRA = {"sfedkd": ["method.num_teachers=2"], "hydra": ["partition.name=dominant_label"]}


def rounds(method: str, mesh_spec: str, num_rounds: int):
  cfg = config_lib.load_config(
      None, SYN + [f"method.name={method}", f"exec.mesh={mesh_spec}", *EXTRA.get(method, [])])
  exp = train.prepare(cfg)
  mesh = run_mesh(exp)
  init, rnd, _ = build_programs(exp, mesh)
  seed_data, shared = split_data(exp.data)
  keys, seed_data, shared, _ = place(
      mesh, make_seed_keys(exp.seeds), seed_data, shared, shared)
  state = init(keys)
  metrics = []
  for r in range(num_rounds):
    state, m = rnd(state, seed_data, round_keys(keys, r), shared)
    metrics.append(jax.device_get(m))
  leaves = jax.tree.leaves(state)
  specs = sorted({str(getattr(a.sharding, "spec", None)) for a in leaves})
  return jax.device_get(state), metrics, (dict(mesh.shape) if mesh else None), specs


def numeric(tree):
  return [np.asarray(a, np.float64) for a in jax.tree.leaves(tree)
          if np.issubdtype(np.asarray(a).dtype, np.number)]


def main(methods, num_rounds=1):
  for method in methods:
    a, ma, _, _ = rounds(method, "seeds=1,clients=1", num_rounds)
    b, mb, shape, specs = rounds(method, "auto", num_rounds)
    diff = max(float(np.max(np.abs(x - y))) if x.size else 0.0
               for x, y in zip(numeric((a, ma)), numeric((b, mb)), strict=True))
    print(json.dumps({"method": method, "mesh": shape, "state_specs": specs,
                      "max_diff": diff, "devices": jax.device_count()}), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
