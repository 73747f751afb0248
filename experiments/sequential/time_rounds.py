"""Wall time of one round per method on this machine (compile excluded).

Usage: python experiments/sequential/time_rounds.py CONFIG [overrides...]
  [--methods fedavg,fedseq,...] [--rounds 3]

Builds each method's jitted round exactly as ``jsfl run`` does (one seed
unless ``run.seeds`` is overridden), runs one round to compile, then times
``--rounds`` more and prints the median seconds per round.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jsfl import config as config_lib
from jsfl.train import experiment, programs

METHODS = "fedavg,fedprox,fedcurv,fedntd,fedseq,cwc,sfedkd"


def round_runner(cfg: dict):
  """``(exp, run(r))`` for a config: its programs built as ``jsfl run``
  builds them, its slots initialised, ``run(r)`` stepping round ``r``
  (blocking until it is done); used by ``grad_norms.py`` too."""
  exp = experiment.prepare(cfg)
  init, rnd, _ = programs.build_programs(exp)
  seed_data, shared = programs.split_data(exp.data)
  keys = programs.make_seed_keys(exp.seeds)
  state = init(keys)

  def run(r: int):
    nonlocal state
    state, m = rnd(state, seed_data, programs.round_keys(keys, r), shared)
    jax.block_until_ready(m)
  return exp, run


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("config")
  ap.add_argument("overrides", nargs="*")
  ap.add_argument("--methods", default=METHODS)
  ap.add_argument("--rounds", type=int, default=3)
  a = ap.parse_args()
  for name in a.methods.split(","):
    cfg = config_lib.load_config(a.config, ["run.seeds=1", *a.overrides,
                                            f"method.name={name}"])
    exp, run = round_runner(cfg)
    t0 = time.perf_counter()
    run(0)
    first = time.perf_counter() - t0
    times = []
    for r in range(1, a.rounds + 1):
      t0 = time.perf_counter()
      run(r)
      times.append(time.perf_counter() - t0)
    print(f"{name:8s} first round (with compile) {first:6.1f} s | round "
          f"{np.median(times):6.2f} s (median of {len(times)}, seeds={len(exp.seeds)})",
          flush=True)


if __name__ == "__main__":
  main()
