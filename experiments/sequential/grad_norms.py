"""The 2-norms of the client steps' gradients of a run: how often a bound of
``optim.clip_norm`` would clip.

Usage: python experiments/sequential/grad_norms.py CONFIG [overrides...]
  [--rounds 5] [--bounds 10,50,100] [--out DIR]

Runs the config's rounds as ``jsfl run`` builds them (``run.seeds``
seeds, the backend's seed loop) with the optimiser's clip transform
(``jsfl.core.optim.clip_grad_norm``) wrapped to hand every step's norm,
before clipping, to the host.  Without ``optim.clip_norm`` in the
overrides the bound is 1e30: every step is multiplied by exactly 1, so the
run is the unclipped one and the norms are its own.  Prints the count of
steps above each of ``--bounds`` and the norms' quantiles, and writes them
with the machine to ``OUT/grad_norms-<method>-<stamp>.json`` (default
``experiments/sequential/results/grad_norms/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import numpy as np
import optax
from time_rounds import round_runner  # a sibling script: its folder is on sys.path

import jsfl.core.optim as optim
from jsfl import config as config_lib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "grad_norms")


def observing_clip(norms: list, clip=optim.clip_grad_norm):
  """``clip_grad_norm`` that also appends each step's norm to ``norms``."""
  def make(max_norm):
    inner = clip(max_norm)

    def update(updates, state, params=None):
      jax.debug.callback(lambda v: norms.append(float(v)), optax.tree.norm(updates))
      return inner.update(updates, state, params)
    return optax.GradientTransformation(inner.init, update)
  return make


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("config")
  ap.add_argument("overrides", nargs="*")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--bounds", default="10,50,100")
  ap.add_argument("--out", default=OUT)
  a = ap.parse_args()
  observe_only = not any(o.startswith("optim.clip_norm=") for o in a.overrides)
  overrides = [*a.overrides, *(["optim.clip_norm=1e30"] if observe_only else [])]
  cfg = config_lib.load_config(a.config, overrides)
  norms: list[float] = []
  optim.clip_grad_norm = observing_clip(norms)
  exp, run = round_runner(cfg)
  t0 = time.perf_counter()
  for r in range(a.rounds):
    run(r)
  jax.effects_barrier()
  x = np.asarray(norms)
  typed = config_lib.typed(cfg)
  bounds = [float(b) for b in a.bounds.split(",")]
  res = {
      "config": a.config, "overrides": a.overrides, "method": typed.method.name,
      "rounds": a.rounds, "seeds": len(exp.seeds),
      "clip_norm": None if observe_only else typed.optim.clip_norm,
      "steps": int(x.size),
      "above": {f"{b:g}": int((x > b).sum()) for b in bounds},
      "quantiles": {q: float(np.quantile(x, float(q))) for q in ("0.5", "0.9", "0.99")},
      "max": float(x.max()), "wall_s": time.perf_counter() - t0,
      "machine": {"backend": jax.default_backend(), "host": platform.node(),
                  "cpu": platform.processor() or platform.machine(),
                  "jax": jax.__version__},
  }
  print(f"{res['method']} {' '.join(a.overrides)}: {res['steps']} steps over {a.rounds} rounds "
        f"x {res['seeds']} seeds; above " + ", ".join(
            f"{b}: {n} ({100 * n / max(x.size, 1):.2f}%)" for b, n in res["above"].items())
        + f"; median {res['quantiles']['0.5']:.2f}, p99 {res['quantiles']['0.99']:.1f}, "
        f"max {res['max']:.1f}")
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, f"grad_norms-{res['method']}-{time.strftime('%Y%m%d-%H%M%S')}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(res, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
