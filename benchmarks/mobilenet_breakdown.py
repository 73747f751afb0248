"""Where a MobileNetV1 x0.5 training step goes, stage by stage, in jsfl and
in PyTorch (the port the Hydra cross-check runs), on one core.

Batch 64, Fashion-MNIST shapes, the Hydra cross-check's model (width 0.5).
For every stage: the forward and backward of that stage alone (a VJP with a
cotangent on its output: the gradients of its parameters and its input), in
jsfl under the CPU's default lowerings (im2col dense convolutions, shifted
multiply-adds for depthwise ones) and, for the depthwise stages, XLA's
grouped convolution too; in PyTorch the same stage's ``forward`` and
``backward``.  Stages are summed by kind (stem, stride-1 depthwise, stride-2
depthwise, pointwise, classifier), and the whole step (forward, backward,
SGD) is timed on each side.  The per-stage sum is what the step costs
without XLA's cross-stage fusion (and PyTorch's allocator reuse).

Run it pinned to one core on both sides (one core is what one of the
authors' processes gets in the equal-cores benchmark):

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 \\
      python benchmarks/mobilenet_breakdown.py --torch-json /tmp/torch.json
    # first, from an environment with torch (the authors' venv), no jax needed:
    taskset -c 0 python benchmarks/mobilenet_breakdown.py --torch-only --out-json /tmp/torch.json

Writes ``results/mobilenet_breakdown-<host>-<time>.json`` (both sides when
``--torch-json`` is given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

WIDTH, BATCH, SHAPE, CLASSES = 0.5, 64, (28, 28, 1), 10
PORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments",
                    "hydra", "authors_code")


def kinds(strides) -> list[str]:
  """Stage kinds of the 28 stages (depthwise strides from the model's table)."""
  out = ["stem"]
  for s in strides:
    out += [f"depthwise s{s}", "pointwise"]
  return out + ["classifier"]


def timed(fn, n: int) -> float:
  fn()
  t0 = time.perf_counter()
  for _ in range(n):
    fn()
  return (time.perf_counter() - t0) / n


def torch_side(n: int) -> dict:
  import torch
  torch.set_num_threads(1)
  sys.modules.setdefault("jsfl_glue", types.SimpleNamespace(WIDTH=WIDTH))
  sys.path.insert(0, PORT)
  from models.mobilenet import BLOCKS, stages
  st = stages(SHAPE[2], CLASSES, WIDTH)
  x = torch.randn(BATCH, SHAPE[2], SHAPE[0], SHAPE[1])
  per_stage = []
  h = x
  for s in st:
    s.train()
    inp = h.detach().requires_grad_(True)
    out = s(inp)
    ct = torch.randn_like(out)

    def fb(s=s, inp=inp, ct=ct):
      s.zero_grad(set_to_none=True)
      inp.grad = None
      s(inp).backward(ct)
    per_stage.append(timed(fb, n) * 1e3)
    h = out.detach()
  net = torch.nn.Sequential(*st)
  opt = torch.optim.SGD(net.parameters(), lr=0.05)
  y = torch.zeros(BATCH, dtype=torch.long)

  def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
  return {"torch": torch.__version__, "stage_ms": per_stage,
          "step_ms": timed(step, n) * 1e3,
          "kinds": kinds([s for _, s in BLOCKS])}


def jax_side(n: int) -> dict:
  import jax
  import jax.numpy as jnp
  import optax

  from jsfl.models import get_model, mobilenet_v1

  out: dict = {"jax": jax.__version__}
  strides = [s for _, s in mobilenet_v1.BLOCKS]
  out["kinds"] = kinds(strides)
  x = jax.random.normal(jax.random.key(1), (BATCH,) + SHAPE)
  y = jnp.zeros((BATCH,), jnp.int32)
  for dw in ("shifts", "grouped"):
    m = get_model("mobilenet_v1", SHAPE, CLASSES, width=WIDTH, conv_impl="im2col",
                  depthwise_impl=dw)
    p, s = m.init(jax.random.key(0))
    per_stage, h = [], x
    for i in range(m.num_stages):
      def f(pi, hi, i=i):
        return m.apply(pi, s[i:i + 1], hi, start=i, train=True)[0]
      o = jax.jit(f)(p[i:i + 1], h)
      ct = jnp.ones_like(o)
      fb = jax.jit(lambda pi, hi, ct, f=f: jax.vjp(f, pi, hi)[1](ct))
      per_stage.append(timed(lambda fb=fb, pi=p[i:i + 1], h=h, ct=ct:
                             jax.block_until_ready(fb(pi, h, ct)), n) * 1e3)
      h = o

    def loss(p, m=m, s=s):
      logits, _ = m.apply(p, s, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    step = jax.jit(lambda p, loss=loss: jax.tree.map(lambda w, g: w - 0.05 * g, p,
                                                     jax.grad(loss)(p)))
    out[f"stage_ms_{dw}"] = per_stage
    out[f"step_ms_{dw}"] = timed(lambda step=step: jax.block_until_ready(step(p)), n) * 1e3
  return out


def by_kind(stage_ms, kinds_) -> dict:
  acc: dict = {}
  for k, t in zip(kinds_, stage_ms, strict=True):
    acc[k] = acc.get(k, 0.0) + t
  return acc


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--n", type=int, default=30, help="timed repeats per measurement")
  ap.add_argument("--torch-only", action="store_true", help="time PyTorch's side only")
  ap.add_argument("--out-json", help="with --torch-only: write its figures here")
  ap.add_argument("--torch-json", help="PyTorch's figures (from --torch-only) to set beside")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  if args.torch_only:
    t = torch_side(args.n)
    print(json.dumps({k: v for k, v in t.items() if k != "stage_ms"}))
    if args.out_json:
      with open(args.out_json, "w") as f:
        json.dump(t, f)
    return
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  res = {"machine": _results.machine(), "host": _results.host(), "cpu": _results.cpu_model(),
         "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "width": WIDTH, "batch": BATCH, "jsfl": jax_side(args.n)}
  if args.torch_json:
    with open(args.torch_json) as f:
      res["pytorch"] = json.load(f)
  j = res["jsfl"]
  cols = [("jsfl shifts", by_kind(j["stage_ms_shifts"], j["kinds"])),
          ("jsfl grouped", by_kind(j["stage_ms_grouped"], j["kinds"]))]
  if "pytorch" in res:
    cols.append(("PyTorch", by_kind(res["pytorch"]["stage_ms"], res["pytorch"]["kinds"])))
  print(f"{'ms, forward + backward':<22}" + "".join(f"{c:>14}" for c, _ in cols))
  for k in dict.fromkeys(j["kinds"]):
    print(f"{k:<22}" + "".join(f"{d[k]:>14.2f}" for _, d in cols))
  print(f"{'sum of stages':<22}" + "".join(f"{sum(d.values()):>14.2f}" for _, d in cols))
  steps = [j["step_ms_shifts"], j["step_ms_grouped"]] + (
      [res["pytorch"]["step_ms"]] if "pytorch" in res else [])
  print(f"{'whole step (+ SGD)':<22}" + "".join(f"{t:>14.2f}" for t in steps))
  path = _results.write_json(_results.path(args.out, "mobilenet_breakdown", _results.host()), res)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
