"""Which lowering keeps a seed-batched server step on fast kernels.

The SFL server visits the round's participants one after another; with seeds
batched (``exec.seed_exec = "vmap"``) each visit is a forward and backward of
the server portion for every seed at once.  This benchmark times that visit
alone (no part-1, no data pipeline), ten visits in a ``lax.scan`` gated by
``lax.cond`` as :func:`jsfl.engine.split.serve_in_order` runs them, under
several lowerings of the seed axis:

* ``vmap_grad``: ``vmap`` over seeds of ``value_and_grad`` (the engine
  today): every dense weight gradient becomes a feature-grouped convolution;
* ``grad_vmap``: ``grad`` of the sum of the vmapped losses (same values): the
  weight gradients become batch-grouped convolutions;
* ``map``: a rolled ``lax.map`` over seeds (ungrouped, serial);
* ``conv_impl`` ``xla`` / ``im2col`` (1x1 convolutions as batched matmuls,
  spatial ones as patches @ kernel), ``depthwise_impl`` ``grouped`` /
  ``shifts``; ``bf16``: parameters and activations cast to bfloat16 inside
  the step (a bound on what bfloat16 compute gives, not the library's
  option); ``unroll``: the ten visits unrolled.

For each cell: compile seconds, ms per visit, samples/s (seeds x batch per
visit), XLA's memory analysis of the compiled program, and a census of the
compiled program's convolution and matmul calls (cuDNN / cuBLAS custom-call
targets with their group counts on a GPU; the HLO ops elsewhere).  Rows are
written as they finish (``seed_kernels-partial.json``), so a run stopped by
a time limit keeps what it measured.

Usage::

  python benchmarks/seed_kernels.py                 # the GPU grid
  python benchmarks/seed_kernels.py --smoke         # toy sizes, any backend
  python benchmarks/seed_kernels.py --cells resnet18:8:im2col/vmap_grad   # chosen cells
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsfl.core.loss import masked_cross_entropy
from jsfl.models import get_model, layers

VISITS = 10


def census(hlo: str) -> dict:
  """Convolution and matmul calls of a compiled program's HLO text, by kind.

  On a GPU the convolutions are cuDNN custom calls (``__cudnn$convForward``,
  ``...BackwardFilter``, ``...BackwardInput``, fused variants) and matmuls
  cuBLAS ones (``__cublas$gemm``, ``__cublas$lt$matmul``) or Triton fusions;
  elsewhere the HLO ops themselves.  Group counts are read off each line.
  """
  kinds: collections.Counter = collections.Counter()
  for line in hlo.splitlines():
    target = re.search(r'custom_call_target="([^"]+)"', line)
    if target and ("cudnn" in target.group(1) or "cublas" in target.group(1)):
      name = target.group(1)
    elif re.search(r"=\s*\S+\s+convolution\(", line):
      name = "convolution"
    elif re.search(r"=\s*\S+\s+dot\(", line):
      name = "dot"
    else:
      continue
    fgc = re.search(r"feature_group_count=(\d+)", line)
    bgc = re.search(r"batch_group_count=(\d+)", line)
    window = re.search(r"window=\{size=(\S+)", line)
    key = name
    if fgc:
      key += f" fgc={fgc.group(1)}"
    if bgc:
      key += f" bgc={bgc.group(1)}"
    if window:
      key += f" window={window.group(1).rstrip(',}')}"
    kinds[key] += 1
  return dict(sorted(kinds.items()))


def server_visits(model, cut, order, seed_exec, unroll, bf16, lr=0.01):
  """Ten sequential server visits for every seed: ``(params, stats, acts, ys)
  -> (params, stats, loss)``, acts ``(S, VISITS, B, ...)``."""
  def loss_fn(p, s, a, y):
    if bf16:
      p = jax.tree.map(lambda t: t.astype(jnp.bfloat16), p)
      a = a.astype(jnp.bfloat16)
    mask = jnp.ones(y.shape, bool)
    logits, ns = model.apply(p, s, a, start=cut, train=True, mask=mask)
    ns = jax.tree.map(lambda t: t.astype(jnp.float32), ns)
    return masked_cross_entropy(logits.astype(jnp.float32), y, mask), ns

  def step_one(p, s, a, y):  # one seed's visit
    (loss, ns), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s, a, y)
    return jax.tree.map(lambda w, d: w - lr * d.astype(w.dtype), p, g), ns, loss

  def step_all(p, s, a, y):  # every seed's visit (leading seed axis)
    if order == "vmap_grad":
      return jax.vmap(step_one)(p, s, a, y)
    if order == "grad_vmap":
      def total(pp):
        losses, ns = jax.vmap(loss_fn)(pp, s, a, y)
        return jnp.sum(losses), (ns, losses)
      g, (ns, losses) = jax.grad(total, has_aux=True)(p)
      return jax.tree.map(lambda w, d: w - lr * d.astype(w.dtype), p, g), ns, losses
    raise ValueError(order)

  def visits(p, s, acts, ys):
    def visit(carry, k):
      p, s = carry
      live = k >= 0  # always true; a traced predicate, as the engine's cond
      p, s, loss = lax.cond(live, lambda: step_all(p, s, acts[:, k], ys[:, k]),
                            lambda: (p, s, jnp.zeros(acts.shape[:1], jnp.float32)))
      return (p, s), loss
    (p, s), losses = lax.scan(visit, (p, s), jnp.arange(VISITS), unroll=unroll)
    return p, s, losses

  if seed_exec == "vmap":
    return visits

  def mapped(p, s, acts, ys):  # a rolled loop over seeds of one seed's visits
    def one(args):
      pp, ss, aa, yy = jax.tree.map(lambda t: t[None], args)
      out = visits(pp, ss, aa, yy)
      return jax.tree.map(lambda t: t[0], out)
    return lax.map(one, (p, s, acts, ys))
  return mapped


def cell(model_name, width, seeds, batch, variant, repeats, input_shape):
  conv, dw, order, seed_exec, unroll, bf16 = (
      variant["conv"], variant["dw"], variant["order"], variant["seed_exec"],
      variant["unroll"], variant["bf16"])
  opts = {"conv_impl": conv, "width": width}
  if model_name == "mobilenet_v1":
    opts["depthwise_impl"] = dw
  model = get_model(model_name, input_shape, 10, **opts)
  cut = model.default_cut
  keys = jax.random.split(jax.random.key(0), seeds)
  params, stats = jax.vmap(model.init)(keys)
  p2 = jax.tree.map(lambda t: t, params[cut:])
  s2 = stats[cut:]
  act_shape = jax.eval_shape(
      lambda p, s, x: model.apply(p, s, x, train=True)[0],
      jax.tree.map(lambda t: t[0], params[:cut]), jax.tree.map(lambda t: t[0], stats[:cut]),
      jax.ShapeDtypeStruct((batch,) + tuple(input_shape), jnp.float32)).shape
  rng = np.random.default_rng(0)
  acts = jnp.asarray(rng.standard_normal((seeds, VISITS) + act_shape, np.float32))
  ys = jnp.asarray(rng.integers(0, 10, (seeds, VISITS, batch)), jnp.int32)
  fn = jax.jit(server_visits(model, cut, order, seed_exec, unroll, bf16),
               donate_argnums=(0, 1))
  t0 = time.perf_counter()
  compiled = fn.lower(p2, s2, acts, ys).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  # the im2col forms are ``auto``'s here: named, so a row says what it timed
  row = {"compile_s": round(compile_s, 2), "act_shape": list(act_shape),
         "im2col_grad": layers.default_im2col_grad(),
         "im2col_narrow": layers.default_im2col_narrow(),
         "census": census(compiled.as_text())}
  if mem is not None:
    for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"):
      row[k] = int(getattr(mem, k, 0))
  state = (p2, s2)
  times = []
  for i in range(repeats + 1):
    t = time.perf_counter()
    p, s, losses = compiled(*state, acts, ys)
    jax.block_until_ready(losses)
    if i:
      times.append(time.perf_counter() - t)
    state = (p, s)
  if not bool(jnp.all(jnp.isfinite(losses))):
    row["nonfinite"] = True
  visit_s = statistics.median(times) / VISITS
  row.update(ms_per_visit=round(visit_s * 1e3, 4),
             samples_per_s=round(seeds * batch / visit_s, 1),
             times_s=[round(t, 5) for t in times])
  return row


VARIANTS = {  # name -> (conv, depthwise, order, seed_exec, unroll, bf16)
    "xla/vmap_grad": ("xla", "grouped", "vmap_grad", "vmap", 1, False),
    "xla/grad_vmap": ("xla", "grouped", "grad_vmap", "vmap", 1, False),
    "im2col/vmap_grad": ("im2col", "grouped", "vmap_grad", "vmap", 1, False),
    "im2col/grad_vmap": ("im2col", "grouped", "grad_vmap", "vmap", 1, False),
    "im2col+shifts/vmap_grad": ("im2col", "shifts", "vmap_grad", "vmap", 1, False),
    "xla/map": ("xla", "grouped", "vmap_grad", "map", 1, False),
    "xla/vmap_grad/unroll": ("xla", "grouped", "vmap_grad", "vmap", VISITS, False),
    "xla/grad_vmap/bf16": ("xla", "grouped", "grad_vmap", "vmap", 1, True),
    "im2col/vmap_grad/bf16": ("im2col", "grouped", "vmap_grad", "vmap", 1, True),
    "im2col/grad_vmap/bf16": ("im2col", "grouped", "grad_vmap", "vmap", 1, True),
}


def plan(smoke):
  """(model, width, seeds, variants) in the order they are measured: the
  most telling cells first, so a time limit cuts the least useful ones."""
  if smoke:
    return [("small_cnn", 4, 2, ["xla/vmap_grad", "im2col/grad_vmap/bf16"])]
  mob = ["xla/vmap_grad", "xla/grad_vmap", "im2col/vmap_grad", "im2col/grad_vmap",
         "im2col+shifts/vmap_grad", "xla/grad_vmap/bf16", "im2col/vmap_grad/bf16"]
  return [("mobilenet_v1", 1.0, 16, mob),
          ("resnet18", 1.0, 8, ["xla/vmap_grad", "xla/grad_vmap", "im2col/vmap_grad",
                                "im2col/grad_vmap", "xla/grad_vmap/bf16"]),
          ("mobilenet_v1", 1.0, 1, ["xla/vmap_grad", "im2col/vmap_grad",
                                     "xla/vmap_grad/unroll"]),
          ("resnet18", 1.0, 1, ["xla/vmap_grad", "im2col/vmap_grad"]),
          ("mobilenet_v1", 1.0, 16, ["xla/map", "xla/vmap_grad/unroll"]),
          ("mobilenet_v1", 1.0, 64, ["xla/grad_vmap", "im2col/vmap_grad"])]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--smoke", action="store_true", help="toy sizes (any backend)")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--deadline", type=float, default=None,
                  help="seconds after which no further cell is started")
  ap.add_argument("--cells", nargs="*", default=None,
                  help="MODEL:SEEDS:VARIANT[:WIDTH] cells (width 1.0 unless named; "
                  "small_cnn's is an int) instead of the grid")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  cells = None
  if args.cells:
    cells = [c.split(":") for c in args.cells]
    bad = [c for c, parts in zip(args.cells, cells, strict=True)
           if len(parts) not in (3, 4) or not parts[1].isdigit() or parts[2] not in VARIANTS]
    if bad:
      ap.error(f"--cells {' '.join(bad)}: MODEL:SEEDS:VARIANT[:WIDTH]; variants allowed: "
               f"{', '.join(VARIANTS)}")
  batch = 8 if args.smoke else args.batch
  repeats = 1 if args.smoke else args.repeats
  input_shape = (16, 16, 3) if args.smoke else (32, 32, 3)
  res = {"machine": _results.machine(), "batch": batch, "visits": VISITS, "rows": [],
         "command": "python benchmarks/seed_kernels.py " + " ".join(sys.argv[1:])}
  print(res["machine"], flush=True)
  start = time.perf_counter()
  width = lambda c: (float(c[3]) if "." in c[3] else int(c[3])) if len(c) == 4 else 1.0
  grid = ([(c[0], width(c), int(c[1]), [c[2]]) for c in cells] if cells else plan(args.smoke))
  for model_name, width, seeds, names in grid:
    for name in names:
      if args.deadline is not None and time.perf_counter() - start > args.deadline:
        res.setdefault("skipped", []).append([model_name, seeds, name])
        continue
      v = dict(zip(("conv", "dw", "order", "seed_exec", "unroll", "bf16"), VARIANTS[name]))
      head = {"model": model_name, "width": width, "seeds": seeds, "variant": name}
      try:
        row = {**head, **cell(model_name, width, seeds, batch, v, repeats, input_shape)}
      except Exception as e:  # an out-of-memory cell is a result, not the end
        row = {**head, "error": f"{type(e).__name__}: {str(e)[:300]}"}
      res["rows"].append(row)
      print(f"{model_name:13s} S={seeds:3d} {name:26s} "
            + (row["error"] if "error" in row else
               f"{row['ms_per_visit']:9.3f} ms/visit {row['samples_per_s']:11,.0f} samples/s "
               f"compile {row['compile_s']:6.1f} s temp "
               f"{row.get('temp_size_in_bytes', 0) / 2**20:9.1f} MiB"), flush=True)
      _results.write_partial(args.out, "seed_kernels", res)
  path = _results.write_json(
      _results.path(args.out, "seed_kernels", jax.default_backend(), _results.host()), res)
  _results.drop_partial(args.out, "seed_kernels")
  print("census of the first cell:", json.dumps(res["rows"][0].get("census"), indent=1))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
