"""Where a small-CNN training step spends its time on this machine, against
PyTorch's step and the matmul peak.

Times, batch 64, Fashion-MNIST shapes: an f32 1024x1024 matmul (the peak
that FLOP/s are set against); jsfl's whole training step (forward, backward,
SGD) of ``small_cnn`` under ``im2col`` and ``xla`` convolutions; each of its
two convolutions alone (conv + ReLU, forward and forward + both gradients)
under both lowerings; and, when PyTorch is importable, the same network's
step in PyTorch (one thread when ``--threads 1``).  Run it once with XLA on
all cores and once pinned to one
(``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 ... --threads 1``).

    python benchmarks/step_breakdown.py
    # PyTorch's step alone, from an environment that has torch (no jax needed)
    python benchmarks/step_breakdown.py --torch-only --threads 1

Writes ``results/step_breakdown-<host>-<threads>t-<time>.json``.
"""

from __future__ import annotations

import argparse
import os
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)


def bench(fn, *args, n: int = 40) -> float:
  import jax
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  for _ in range(n):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / n


def torch_step_s(threads: int, n: int = 200) -> float | None:
  try:
    import torch
    import torch.nn.functional as F
    from torch import nn
  except ImportError:
    return None
  torch.set_num_threads(threads)
  net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))
  opt = torch.optim.SGD(net.parameters(), lr=0.05)
  x, y = torch.randn(64, 1, 28, 28), torch.zeros(64, dtype=torch.long)

  def step():
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
  for _ in range(20):
    step()
  t0 = time.perf_counter()
  for _ in range(n):
    step()
  return (time.perf_counter() - t0) / n


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--threads", type=int, default=os.cpu_count(),
                  help="PyTorch's threads (XLA's are set by XLA_FLAGS / taskset)")
  ap.add_argument("--torch-only", action="store_true",
                  help="time only PyTorch's step (prints it; writes nothing)")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  if args.torch_only:
    t = torch_step_s(args.threads)
    print("torch is not installed" if t is None else
          f"torch_step_ms ({args.threads} thread{'s' * (args.threads > 1)}) {t * 1e3:.3f}")
    return

  import jax
  import jax.numpy as jnp
  import optax

  from jsfl.models import get_model
  from jsfl.models.layers import conv2d

  out: dict = {"machine": _results.machine(), "host": _results.host(), "cpus": os.cpu_count(),
               "xla_flags": os.environ.get("XLA_FLAGS", ""), "threads": args.threads}
  a = jnp.ones((1024, 1024))
  out["matmul_gflop_per_s"] = 2 * 1024 ** 3 / bench(jax.jit(lambda a: a @ a), a, n=20) / 1e9
  x = jax.random.normal(jax.random.key(1), (64, 28, 28, 1))
  y = jnp.zeros((64,), jnp.int32)
  for impl in ("im2col", "xla"):
    m = get_model("small_cnn", (28, 28, 1), 10, conv_impl=impl)
    p, s = m.init(jax.random.key(0))

    def loss(p, m=m, s=s):
      logits, _ = m.apply(p, s, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    step = jax.jit(lambda p, loss=loss: jax.tree.map(lambda w, g: w - 0.05 * g, p,
                                                     jax.grad(loss)(p)))
    out[f"step_ms_{impl}"] = bench(step, p, n=200) * 1e3
  for h, cin, cout in ((28, 1, 16), (14, 16, 32)):
    xc = jax.random.normal(jax.random.key(0), (64, h, h, cin))
    k = jnp.full((3, 3, cin, cout), 0.1)
    for impl in ("im2col", "xla"):
      def f(xc, k, impl=impl):
        return jnp.sum(jax.nn.relu(conv2d(xc, k, impl=impl)) ** 2)
      tag = f"conv_{cin}to{cout}_{impl}"
      out[tag + "_fwd_ms"] = bench(jax.jit(f), xc, k) * 1e3
      out[tag + "_fwd_bwd_ms"] = bench(jax.jit(jax.grad(f, (0, 1))), xc, k) * 1e3
  t = torch_step_s(args.threads)
  out["torch_step_ms"] = None if t is None else t * 1e3
  out["flops_per_step"] = 64 * 7.39e6  # XLA's count (benchmarks/hydra_vs_authors.py)
  for k, v in out.items():
    print(f"{k:<32} {v:.3f}" if isinstance(v, float) else f"{k:<32} {v}")
  path = _results.write_json(
      _results.path(args.out, "step_breakdown", _results.host(), f"{args.threads}t"), out)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
