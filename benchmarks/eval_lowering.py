"""Seconds of one whole-test-set evaluation pass per conv lowering and chunk.

Evaluation is a forward pass with no gradient, so its convolutions may be
lowered differently from training's (``model.eval_conv_impl``).  For each
model this times jsfl's evaluation (``jsfl.train.evaluate.evaluate``: the
chunked pass over 10,000 Fashion-MNIST-shaped samples, accuracy, loss and
per-label counts) under ``eval_conv_impl`` = ``same`` (the training
lowering), ``xla``, ``im2col`` and ``auto`` (the per-layer rule of
``jsfl.models.layers.inference_conv_impl``), at several ``exec.eval_batch``
chunks.  Medians of ``--repeats`` passes after one compiling pass.

    python benchmarks/eval_lowering.py
    python benchmarks/eval_lowering.py --models small_cnn --chunks 250 1000

Writes ``results/eval_lowering-<backend>-<host>-<time>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

MODELS = {"small_cnn": {}, "mobilenet_v1": {"width": 0.5}}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
  ap.add_argument("--impls", nargs="+", default=["same", "xla", "im2col", "auto"])
  ap.add_argument("--chunks", nargs="+", type=int, default=[250, 1000])
  ap.add_argument("--samples", type=int, default=10000)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  from jsfl.models import get_model
  from jsfl.train.evaluate import chunk_test_set, evaluate

  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (args.samples, 28, 28, 1), dtype=np.uint8)
  y = rng.integers(0, 10, (args.samples,), dtype=np.int32)
  rows = []
  for name in args.models:
    base = get_model(name, (28, 28, 1), 10, eval_conv_impl="same", **MODELS[name])
    params, stats = jax.jit(base.init)(jax.random.key(0))
    for impl in args.impls:
      model = get_model(name, (28, 28, 1), 10, eval_conv_impl=impl, **MODELS[name])
      for chunk in args.chunks:
        test = jax.tree.map(jnp.asarray, chunk_test_set(x, y, chunk))
        fn = jax.jit(lambda p, s, t, m=model: evaluate(m, p, s, t, 0.0, 1.0, 10))
        jax.block_until_ready(fn(params, stats, test))
        times = []
        for _ in range(args.repeats):
          t0 = time.perf_counter()
          acc = jax.block_until_ready(fn(params, stats, test))["accuracy"]
          times.append(time.perf_counter() - t0)
        row = {"model": name, "eval_conv_impl": impl, "eval_batch": chunk,
               "s_per_pass": statistics.median(times), "accuracy": float(acc)}
        rows.append(row)
        print(f"{name:<13} {impl:<7} chunk {chunk:>5}: {row['s_per_pass']:.3f} s per "
              f"{args.samples} samples", flush=True)
  path = _results.write_json(
      _results.path(args.out, "eval_lowering", jax.default_backend(), _results.host()),
      {"machine": _results.machine(),
       "args": vars(args), "rows": rows})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
