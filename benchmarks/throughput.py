"""Throughput of an SFL round: jsfl's jitted round against the papers' way.

Workload (issue "core engine", item 10): synthetic CIFAR-shaped data, a split
model (default MobileNetV1, cut 4), batch 64, every client holding
``steps * batch`` samples so a round is ``steps`` batch steps; 10 and 100
clients; 1 and 8 seeds.  Compared with

* (a) the same math as a Python loop over seeds, batch steps and clients of
  jitted per-client steps (part-1 forward, server step in processing order,
  part-1 backward, round-end average) -- how the papers' PyTorch code runs;
* (b) a centralised training step of the whole model at the same total batch
  (``clients * batch``): the limit a split round can approach.

``--strategies`` also times the client-execution strategies (vmap / map /
unroll) and conv lowerings (xla / im2col, grouped / shifts) so the default per
backend is a measurement, not a guess.  Prints a table and the ratios and
writes ``benchmarks/results/throughput-<backend>-<host>-<time>.json``.

Usage::

  python benchmarks/throughput.py                      # the issue's grid
  python benchmarks/throughput.py --clients 10 --seeds 1 --strategies
  python benchmarks/throughput.py --width 0.25 --clients 4 --seeds 1 2 --repeats 1  # quick check
"""

from __future__ import annotations

import argparse
import statistics
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)
import jax
import jax.numpy as jnp
import numpy as np

from jsfl import train
from jsfl.core.data import RoundData
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.optim import make_optimizer, with_lr
from jsfl.core.portion import Portion
from jsfl.data import load_dataset, normalize
from jsfl.engine import split
from jsfl.methods import sfl
from jsfl.models import layers
from jsfl.train.programs import default_client_exec, default_seed_exec, make_seed_keys, seed_program


def _block(x):
  return jax.block_until_ready(x)


def _timed(fn, repeats):
  """(first-call seconds incl. compile, median of `repeats` later calls)."""
  t = time.perf_counter()
  _block(fn())
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - t)
  return first, statistics.median(times)


def workload(args, clients, seeds):
  ds = load_dataset("synthetic", input_shape=(32, 32, 3), num_classes=10,
                    train_size=clients * args.steps * args.batch, test_size=10, seed=0)
  n_per = args.steps * args.batch
  table = np.arange(clients * n_per, dtype=np.int32).reshape(clients, n_per)
  data = {"x": jnp.asarray(ds.x_train), "y": jnp.asarray(ds.y_train),
          "mean": jnp.asarray(ds.mean), "std": jnp.asarray(ds.std)}
  seed_data = {"table": jnp.broadcast_to(table, (seeds,) + table.shape),
               "sizes": jnp.full((seeds, clients), n_per, jnp.int32),
               "dominant": jnp.zeros((seeds, clients), jnp.int32),
               "counts": jnp.zeros((seeds, clients, 10), jnp.int32)}
  return data, seed_data


def make_setup(args, clients, client_exec=None, conv_impl=None, depthwise_impl=None):
  """SFL on the workload, set up from a config as ``jsfl run`` sets it up
  (``None``: what ``auto`` picks on this backend)."""
  client_exec = client_exec or default_client_exec(clients)
  return train.setup_from({
      "model": {"name": args.model, "cut": args.cut,
                **({"width": int(args.width) if args.width.is_integer() else args.width}
                   if args.width != 1.0 else {}),
                "conv_impl": conv_impl or "auto", "depthwise_impl": depthwise_impl or "auto"},
      "partition": {"num_clients": clients},
      "method": {"name": "sfl", "batch_size": args.batch},
      "optim": {"lr": 0.01}, "exec": {"client_exec": client_exec}},
      (32, 32, 3), 10, args.steps * args.batch)


def bench_jsfl(args, clients, seeds, seed_exec=None, **setup_kw):
  """jsfl's round; loops and lowerings as ``jsfl run`` picks them unless given."""
  seed_exec = seed_exec or default_seed_exec()
  setup = make_setup(args, clients, **setup_kw)
  data, seed_data = workload(args, clients, seeds)

  def one(state, sd, key, shared):
    return sfl.round(setup, state, RoundData(**shared, **sd), key)

  init = jax.jit(seed_program(lambda k: sfl.init(setup, k), seed_exec, 1))
  rnd = jax.jit(seed_program(one, seed_exec, 3))
  keys = make_seed_keys(range(seeds))
  state = init(keys)
  first, t = _timed(lambda: rnd(state, seed_data, keys, data), args.repeats)
  return {"first_call_s": first, "round_s": t,
          "samples_per_s": seeds * clients * args.steps * args.batch / t,
          "client_exec": setup.client_exec, "seed_exec": seed_exec}


def bench_loop(args, clients, seeds):
  """The same math as jitted per-client calls driven by Python loops."""
  setup = make_setup(args, clients, client_exec="vmap")
  model = setup.model
  data, seed_data = workload(args, clients, 1)
  tx = make_optimizer()

  @jax.jit
  def fwd(p, s, x):
    return model.apply(p, s, x, train=True)

  @jax.jit
  def server(p2, s2, o2, a, y):
    m = jnp.ones(y.shape, bool)
    srv, g, _, _ = split.server_update(setup, tx, Portion(p2, s2, o2), a, y, m)
    return srv.params, srv.stats, srv.opt, g

  @jax.jit
  def bwd(p, s, o, x, g):
    _, vjp = jax.vjp(lambda q: model.apply(q, s, x, train=True)[0], p)
    return tx.update(vjp(g)[0], o, p)

  @jax.jit
  def apply_updates(p, u):
    return jax.tree.map(jnp.add, p, u)

  @jax.jit
  def average(ps):
    return jax.tree.map(lambda *a: sum(a) / len(a), *ps)

  @jax.jit
  def get_batch(idx):
    return normalize(data["x"][idx], data["mean"], data["std"]), data["y"][idx]

  st = sfl.init(setup, jax.random.key(0))
  lr = 0.01

  def one_round():
    outs = []
    for _ in range(seeds):
      p1 = [st.part1] * clients
      s1 = [st.part1_stats] * clients
      o1 = [with_lr(tx.init(st.part1), lr)] * clients
      p2, s2, o2 = st.part2, st.part2_stats, with_lr(st.server_opt, lr)
      table = np.asarray(seed_data["table"][0])
      for b in range(args.steps):
        xs, ys, acts = [], [], []
        for c in range(clients):
          x, y = get_batch(table[c, b * args.batch:(b + 1) * args.batch])
          a, s1[c] = fwd(p1[c], s1[c], x)
          xs.append(x)
          ys.append(y)
          acts.append(a)
        grads = [None] * clients
        for c in np.random.permutation(clients):
          p2, s2, o2, grads[c] = server(p2, s2, o2, acts[c], ys[c])
        for c in range(clients):
          u, o1[c] = bwd(p1[c], s1[c], o1[c], xs[c], grads[c])
          p1[c] = apply_updates(p1[c], u)
      outs.append((average(p1), p2))
    return outs

  first, t = _timed(one_round, args.repeats)
  return {"first_call_s": first, "round_s": t,
          "samples_per_s": seeds * clients * args.steps * args.batch / t}


def bench_central(args, clients):
  """One whole-model SGD step at batch clients * B (the ceiling).

  Capped at ``--central-max-batch`` (memory: MobileNetV1 at batch 6400 needs
  tens of GB of activations); the batch actually used is recorded.
  """
  setup = make_setup(args, clients)
  model = setup.model
  tx = make_optimizer()
  p, s = model.init(jax.random.key(0))
  o = with_lr(tx.init(p), 0.01)
  B = min(clients * args.batch, args.central_max_batch)
  x = jax.random.normal(jax.random.key(1), (B, 32, 32, 3))
  y = jax.random.randint(jax.random.key(2), (B,), 0, 10)

  @jax.jit
  def step(p, s, o):
    def loss(q):
      logits, ns = model.apply(q, s, x, train=True)
      return masked_cross_entropy(logits, y, jnp.ones((B,), bool)), ns
    (_, ns), g = jax.value_and_grad(loss, has_aux=True)(p)
    u, o = tx.update(g, o, p)
    return jax.tree.map(jnp.add, p, u), ns, o

  first, t = _timed(lambda: step(p, s, o), args.repeats)
  return {"first_call_s": first, "step_s": t, "batch": B, "samples_per_s": B / t}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="mobilenet_v1")
  ap.add_argument("--cut", type=int, default=4)
  ap.add_argument("--width", type=float, default=1.0)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=1, help="batch steps per round")
  ap.add_argument("--clients", type=int, nargs="+", default=[10, 100])
  ap.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--strategies", action="store_true",
                  help="also time client_exec x conv lowerings (smallest clients, 1 seed) "
                  "and seed_exec vmap vs map (--strategy-seeds seeds)")
  ap.add_argument("--strategy-seeds", type=int, default=4)
  ap.add_argument("--strategy-impls", nargs="+",
                  default=["xla:grouped", "xla:shifts", "im2col:grouped", "im2col:shifts"],
                  help="conv:depthwise lowerings to sweep (on XLA:CPU, xla:grouped under "
                  "vmap in a rolled scan ran > 600 s for one 10-client round)")
  ap.add_argument("--skip-loop", action="store_true")
  ap.add_argument("--loop-max-seeds", type=int, default=64,
                  help="skip the loop baseline above this many seeds")
  ap.add_argument("--max-samples", type=int, default=1 << 30,
                  help="skip grid cells with more samples per round (CPU budgets)")
  ap.add_argument("--central-max-batch", type=int, default=2048)
  ap.add_argument("--skip-central", action="store_true")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args(argv)
  res = {"machine": _results.machine(), "args": vars(args),
         # what ``auto`` picks here; each row names its client and seed loops
         "defaults": {"conv_impl": layers.default_conv_impl(),
                      "depthwise_impl": layers.default_depthwise_impl(),
                      "im2col_grad": layers.default_im2col_grad(),
                      "im2col_narrow": layers.default_im2col_narrow(),
                      "seed_exec": default_seed_exec()},
         "rows": []}
  path = _results.path(args.out, "throughput", jax.default_backend(), args.model)
  print(f"# {res['machine']}")
  print("| clients | seeds | jsfl samples/s | loop samples/s | central samples/s | "
        "jsfl/loop | jsfl/central | jsfl compile+first (s) |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  central = {}
  for clients in args.clients:
    if not args.skip_central:
      try:
        central[clients] = bench_central(args, clients)
      except (RuntimeError, MemoryError) as e:  # out of memory at a huge total batch
        central[clients] = {"error": repr(e)[:300]}
    for seeds in args.seeds:
      if clients * seeds * args.steps * args.batch > args.max_samples:
        print(f"| {clients} | {seeds} | skipped: over --max-samples |")
        res["rows"].append({"clients": clients, "seeds": seeds, "skipped": "max-samples"})
        continue
      try:
        row = {"clients": clients, "seeds": seeds, "jsfl": bench_jsfl(args, clients, seeds)}
      except (RuntimeError, MemoryError) as e:  # e.g. a GPU out of memory: the next cell
        print(f"| {clients} | {seeds} | error: {repr(e)[:100]} |", flush=True)
        res["rows"].append({"clients": clients, "seeds": seeds, "error": repr(e)[:300]})
        write(res, path)
        continue
      if not args.skip_loop and seeds <= args.loop_max_seeds:
        row["loop"] = bench_loop(args, clients, seeds)
      row["central"] = central.get(clients)
      j = row["jsfl"]["samples_per_s"]
      lp = row.get("loop", {}).get("samples_per_s")
      ce = (row["central"] or {}).get("samples_per_s")
      row["ratio_vs_loop"] = j / lp if lp else None
      row["ratio_vs_central"] = j / ce if ce else None
      res["rows"].append(row)
      fmt = lambda v: f"{v:,.0f}" if v else "-"
      rat = lambda v: f"{v:.2f}" if v else "-"
      print(f"| {clients} | {seeds} | {fmt(j)} | {fmt(lp)} | {fmt(ce)} | "
            f"{rat(row['ratio_vs_loop'])} | {rat(row['ratio_vs_central'])} | "
            f"{row['jsfl']['first_call_s']:.1f} |", flush=True)
      write(res, path)
  if args.strategies:
    clients = min(args.clients)
    res["strategies"] = []
    print("\n| client_exec | seed_exec | conv_impl | depthwise_impl | seeds | samples/s | compile+first (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    impls = [tuple(x.split(":")) for x in args.strategy_impls]
    grid = [(ce_, None, conv_impl, dw, 1) for conv_impl, dw in impls
            for ce_ in ("vmap", "map", "unroll")]
    grid += [(None, se, None, None, args.strategy_seeds) for se in ("vmap", "map")]
    for ce_, seed_exec, conv_impl, dw, seeds in grid:
      r = bench_jsfl(args, clients, seeds, seed_exec=seed_exec, client_exec=ce_,
                     conv_impl=conv_impl, depthwise_impl=dw)
      conv_impl = conv_impl or layers.default_conv_impl()
      dw = dw or layers.default_depthwise_impl()
      ce_, seed_exec = r["client_exec"], r["seed_exec"]
      r.update(client_exec=ce_, seed_exec=seed_exec, conv_impl=conv_impl,
               depthwise_impl=dw, seeds=seeds, clients=clients)
      res["strategies"].append(r)
      print(f"| {ce_} | {seed_exec} | {conv_impl} | {dw} | {seeds} | "
            f"{r['samples_per_s']:,.0f} | {r['first_call_s']:.1f} |", flush=True)
      write(res, path)
  write(res, path)
  print(f"\nwrote {path}")
  return res


def write(res, path):
  """The results so far, so a part stopped at its time limit still leaves its rows."""
  _results.write_json(path, res)


if __name__ == "__main__":
  main()
