"""Training-step rate and XLA's temporaries per form of the im2col lowering.

``conv_impl = "im2col"`` has two choices of form, both picked per backend
by ``auto`` from this measurement (``jsfl.models.layers``):

* ``model.im2col_grad``: the backward forms the kernel gradient from the
  patch matrix built again (``patches``: one matmul) or tap by tap
  (``taps``: a product per kernel tap over a strided view, never holding
  the patch matrix);
* ``model.im2col_narrow``: a spatial convolution over one input channel
  (Fashion-MNIST stems) contracts its taps stacked tap-major (``stacked``:
  one contiguous copy a tap) or the channel-minor patch matrix
  (``patches``: a concatenation of one-channel views).

For each model and pair of forms this compiles ``--steps`` plain SGD steps
(a rolled ``lax.scan``, as the engines' client loops are) over 8 batches in
turn (a fixed batch would let XLA hoist the first layer's patches out of
the loop), reads XLA's memory analysis of the program and times it: best
of ``--repeats`` after one warm-up call.

    taskset -c 0 python benchmarks/im2col_forms.py
    python benchmarks/im2col_forms.py --models lenet5 --steps 200

Writes ``results/im2col_forms-<backend>-<host>-<time>.json``.
"""

from __future__ import annotations

import argparse
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

# model -> (input shape, options, steps per timed call: ~10 s a call on one core)
MODELS = {
    "lenet5": ((28, 28, 1), {}, 100),
    "small_cnn": ((28, 28, 1), {}, 100),
    "resnet18": ((32, 32, 3), {}, 3),
}


# (im2col_grad, im2col_narrow): the CPU's forms before 2026-11-28, the
# kernel gradient alone, today's CPU default, and the rest
FORMS = [("taps", "patches"), ("patches", "patches"), ("patches", "stacked"),
         ("taps", "stacked")]


def measure(name: str, grad: str, narrow: str, batch: int, steps: int,
            repeats: int) -> dict:
  import jax
  import jax.numpy as jnp
  import optax

  from jsfl.models import get_model

  shape, options, _ = MODELS[name]
  model = get_model(name, shape, 10, conv_impl="im2col", im2col_grad=grad,
                    im2col_narrow=narrow, **options)
  params, stats = model.init(jax.random.key(0))
  xs = jax.random.normal(jax.random.key(1), (8, batch) + shape)
  y = jnp.arange(batch) % 10

  def loss(p, x):
    logits, _ = model.apply(p, stats, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def run(p):
    def body(p, i):
      g = jax.grad(loss)(p, xs[i % 8])
      return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), None
    return jax.lax.scan(body, p, jnp.arange(steps))[0]

  compiled = jax.jit(run).lower(params).compile()
  mem = compiled.memory_analysis()
  jax.block_until_ready(compiled(params))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(params))
    best = min(best, time.perf_counter() - t0)
  return {"model": name, "im2col_grad": grad, "im2col_narrow": narrow, "batch": batch,
          "steps": steps,
          "samples_per_s": steps * batch / best,
          "temp_bytes": int(mem.temp_size_in_bytes) if mem else None}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=0, help="0: the model's own (MODELS)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()

  import jax

  from jsfl.models import layers

  rows = []
  for name in args.models:
    one_channel = MODELS[name][0][-1] == 1
    for grad, narrow in FORMS if one_channel else FORMS[:2]:  # narrow: one channel only
      row = measure(name, grad, narrow, args.batch, args.steps or MODELS[name][2],
                    args.repeats)
      rows.append(row)
      print(f"{name:<10} grad {grad:<8} narrow {narrow:<8} {row['samples_per_s']:>9,.0f} "
            f"samples/s  temp {row['temp_bytes'] / 2**20:7.1f} MiB", flush=True)
  backend = jax.default_backend()
  path = _results.write_json(
      _results.path(args.out, "im2col_forms", backend, _results.host()),
      {"machine": _results.machine(), "args": vars(args),
       "default": {"im2col_grad": layers.default_im2col_grad(backend),
                   "im2col_narrow": layers.default_im2col_narrow(backend)}, "rows": rows})
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
