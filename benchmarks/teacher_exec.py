"""The SFedKD teachers' forward per ``method.teacher_exec``.

A student's batch meets M frozen teachers in eval mode
(``jsfl.methods.sfedkd.teacher_logits``): one vmapped forward over the
stacked teachers (``vmap``), or one teacher after another in the same
program (``unroll``, ``map``).  ``auto`` picks per backend
(``sfedkd.default_teacher_exec``) from this measurement.

For each of SFedKD's models (LeNet-5 on Fashion-MNIST, the 8-layer AlexNet
on CIFAR-10, the small CNN on CIFAR-100) this compiles the teachers'
logits over ``--batches`` batches in a rolled ``lax.scan`` (as the round's
teacher cache runs them) and times it: the median of ``--repeats`` after
one warm-up call.

    taskset -c 0 python benchmarks/teacher_exec.py
    python benchmarks/teacher_exec.py --models lenet5 --teachers 5 --batches 50

Writes ``results/teacher_exec-<backend>-<host>-<time>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

# model -> input shape (the SFedKD paper's pairing of model and dataset)
MODELS = {"lenet5": (28, 28, 1), "alexnet": (32, 32, 3), "small_cnn": (32, 32, 3)}
HOWS = ("vmap", "unroll", "map")


def measure(name: str, how: str, teachers: int, batch: int, batches: int,
            repeats: int) -> dict:
  import jax
  import jax.numpy as jnp

  from jsfl.methods import sfedkd
  from jsfl.models import get_model

  shape = MODELS[name]
  model = get_model(name, shape, 10)
  keys = jax.random.split(jax.random.key(0), teachers)
  params, stats = jax.vmap(model.init)(keys)
  xs = jax.random.normal(jax.random.key(1), (batches, batch) + shape)
  setup = types.SimpleNamespace(model=model)  # all teacher_logits reads of a Setup

  def run(p, s):
    def body(acc, x):
      return acc + jnp.sum(sfedkd.teacher_logits(setup, p, s, x, how)), None
    return jax.lax.scan(body, jnp.zeros(()), xs)[0]

  compiled = jax.jit(run).lower(params, stats).compile()
  jax.block_until_ready(compiled(params, stats))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(params, stats))
    times.append(time.perf_counter() - t0)
  t = statistics.median(times)
  return {"model": name, "teacher_exec": how, "teachers": teachers, "batch": batch,
          "batches": batches, "seconds": t,
          "teacher_samples_per_s": teachers * batches * batch / t}


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
  ap.add_argument("--teachers", type=int, default=5, help="M (the paper's 5)")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--batches", type=int, default=20)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args(argv)

  import jax

  from jsfl.methods import sfedkd

  rows = []
  for name in args.models:
    for how in HOWS:
      row = measure(name, how, args.teachers, args.batch, args.batches, args.repeats)
      rows.append(row)
      print(f"{name:<10} {how:<7} {row['teacher_samples_per_s']:>10,.0f} teacher-samples/s",
            flush=True)
  backend = jax.default_backend()
  path = _results.write_json(
      _results.path(args.out, "teacher_exec", backend, _results.host()),
      {"machine": _results.machine(), "args": vars(args),
       "default": sfedkd.default_teacher_exec(backend), "rows": rows})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
