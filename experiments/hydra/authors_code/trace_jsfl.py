"""jsfl's half of the step trace: SFL's first server steps on MobileNetV1.

The cross-check compares medians over seeds; the trace asks whether the two
codes compute the same steps.  From jsfl's seed-0 initialisation (the
authors' setting, ``../fmnist_mobilenet.toml``, SFL cyclic), each client's
first batch of round 1 and the server's order, this runs a round in which
only the first ``k`` clients of the order have their batch, so the server has
taken ``k`` steps, for every ``k`` asked, and writes:

* ``init:<path>``: the whole model's parameters and BatchNorm statistics by
  jsfl path (``<stage>/conv/kernel``, ``<stage>/norm/norm/mean``, ...);
* ``idx`` / ``mask`` / ``order``: every client's first batch (dataset indices
  into the 6k subset) and the server's order, for ``trace_authors.py``;
* ``k<k>:<path>``: the server portion after its ``k``-th step;
* with ``--rounds R``: ``idx_r<r>`` / ``mask_r<r>``, ``seq_r<r>`` (the
  server's serving sequence) and ``r<r>:<path>``, R whole rounds (every
  client, the part-1 average, the next round from it, the decayed lr) and
  the whole model after each; a round keeps its first ``--batches`` batch
  steps (default 1, one batch a client; 0: all); with a small ``--lr`` these
  are not chaotic, so they compare over rounds;
* ``policy``: ``--order`` (cyclic; ``random`` traces whole rounds only, the
  authors' side replaying ``seq_r<r>`` through their job buffer).

``--perturb EPS`` starts the same run from every weight scaled by 1 + EPS:
compared with the unperturbed trace it shows how far a rounding-sized
difference carries (``trace.sh``, part 3).

``--x64`` computes in float64 (the model, the inputs, the steps); jax then
draws the batches from its 64-bit generator, so a float32 trace takes the
batches and the initialisation of a float64 one (``--like``) and both sides
see the same data.  Run from the repository root with jsfl's environment::

    python experiments/hydra/authors_code/trace_jsfl.py /tmp/trace/jsfl64.npz --x64
    python experiments/hydra/authors_code/trace_jsfl.py /tmp/trace/jsfl32.npz \
        --like /tmp/trace/jsfl64.npz

``trace.sh`` runs both halves and ``trace_compare.py``.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("out")
  ap.add_argument("--x64", action="store_true", help="float64 throughout")
  ap.add_argument("--like", help="a --x64 trace whose initialisation and batches to use")
  ap.add_argument("--steps", default="1,2,3,5,7,10",
                  help="server steps after which to record the server (comma list)")
  ap.add_argument("--rounds", type=int, default=0,
                  help="also R whole rounds of one batch a client (the aggregation, the "
                       "next round's start and lr), recording the model after each")
  ap.add_argument("--lr", type=float, help="optim.lr (a small one tames the chaos)")
  ap.add_argument("--lr-min", type=float, help="optim.lr_min")
  ap.add_argument("--order", choices=("cyclic", "random"), default="cyclic",
                  help="SFL's processing order; random traces whole rounds only "
                       "(give --rounds), recording each round's serving sequence")
  ap.add_argument("--batches", type=int, default=1,
                  help="batch steps of each round the trace keeps (0: all of them)")
  ap.add_argument("--perturb", type=float, default=0.0,
                  help="scale every initial weight by 1 + PERTURB (how far a rounding-sized "
                       "difference carries: compare with the unperturbed trace)")
  args = ap.parse_args(argv)
  if args.order == "random" and not args.rounds:
    sys.exit("trace_jsfl: --order random traces whole rounds: give --rounds R")
  if args.x64 == bool(args.like):
    sys.exit("trace_jsfl: give --x64 or --like X64_TRACE (one of them)")
  if args.x64:
    os.environ["JAX_ENABLE_X64"] = "1"
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jsfl.core.data as core_data
  import jsfl.train.evaluate as evaluate_lib
  from jsfl.config import load_config
  from jsfl.engine import schedule, sfl_family, split
  from jsfl.methods import sfl
  from jsfl.train.experiment import prepare
  from jsfl.train.programs import round_data, split_data

  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
  cfg = load_config(os.path.join(root, "experiments/hydra/fmnist_mobilenet.toml"),
                    ["method.name=sfl", f"method.order={args.order}", "run.seeds=1"]
                    + ([f"optim.lr={args.lr}"] if args.lr else [])
                    + ([f"optim.lr_min={args.lr_min}"] if args.lr_min else []))
  exp = prepare(cfg)
  setup = exp.setup.static()
  slot, shared = split_data(exp.data)
  data = round_data(jax.tree.map(lambda a: a[0], slot), shared)
  key = jax.random.key(0)
  state = sfl.init(setup, key)
  c = setup.cut
  like = np.load(args.like) if args.like else None

  def path_of(p, lo):
    return "/".join([str(lo + p[0].idx)] + [str(getattr(q, "key", q)) for q in p[1:]])

  def fill(tree, lo, dtype):
    return jax.tree_util.tree_map_with_path(
        lambda p, v: jnp.asarray(like[f"init:{path_of(p, lo)}"], dtype) if like is not None
        else v.astype(dtype), tree)

  dtype = jnp.float64 if args.x64 else jnp.float32
  state = state.replace(part1=fill(state.part1, 0, dtype),
                        part1_stats=fill(state.part1_stats, 0, dtype),
                        part2=fill(state.part2, c, dtype),
                        part2_stats=fill(state.part2_stats, c, dtype))
  if args.perturb:  # the same round from a start a rounding-sized step away
    grow = lambda t: jax.tree.map(lambda v: v * (1 + args.perturb), t)
    state = state.replace(part1=grow(state.part1), part2=grow(state.part2))
  loss = split.cross_entropy
  if args.x64:
    def normalize64(x, mean, std):  # jsfl's formula, in float64
      return (jnp.asarray(x).astype(jnp.float64) / 255.0 - mean) / std

    core_data.normalize = evaluate_lib.normalize = normalize64
    data = data._replace(mean=data.mean.astype(jnp.float64), std=data.std.astype(jnp.float64))

    def loss(logits, y, mask):  # metrics stay float32 (the idle branch's dtype)
      obj, reported, extra = split.cross_entropy(logits, y, mask)
      return obj, reported.astype(jnp.float32), extra.astype(jnp.float32)

  # the server's order: clients by the rank of their dominant label (cyclic)
  order = np.argsort(np.asarray(state.label_rank)[np.asarray(data.dominant)], kind="stable")

  def round_with(state, live, r, given):
    def plan(*a):
      p = split.plan_at_round(*a)
      if given is not None:
        idx, mask = given
      else:  # the round's first batch steps (or all of them)
        keep = args.batches or p.idx.shape[0]
        idx, mask = p.idx[:keep], p.mask[:keep]
      return p._replace(idx=idx, mask=mask & live[None, :, None])

    alg = sfl_family.algorithm(setup, loss, plan=plan)
    out = split.run_round(alg, setup, state, data, jax.random.fold_in(key, r))
    # the serving sequence, for the authors' side; segments() of it must give
    # the engine's own serving orders (checked below)
    live = jnp.any(out.plan.mask, axis=2)
    seq = schedule.authors_sequence(setup, out.plan.order_key, live, out.plan.clients,
                                    data.dominant, state.label_rank)
    same = jnp.all(schedule.segments(seq, live).order == out.orders)
    return (sfl_family.finish(state, out)[0], out.server, out.plan.idx, out.plan.mask, out.orders,
            seq, same)

  def given_of(name):
    return None if like is None else (jnp.asarray(like[f"idx{name}"]),
                                      jnp.asarray(like[f"mask{name}"]))

  run = jax.jit(round_with)
  dump = {}

  def record(prefix, lo, *trees):
    """``dump[prefix + path]`` for every leaf of stage ranges starting at ``lo``."""
    for tree in trees:
      for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dump[prefix + path_of(p, lo)] = np.asarray(v, np.float64)

  record("init:", 0, state.part1, state.part1_stats)
  record("init:", c, state.part2, state.part2_stats)
  ks = [int(k) for k in args.steps.split(",")] if args.order == "cyclic" else []
  everyone = jnp.ones(setup.clients_per_round, bool)
  _, _, idx, mask, served, *_ = run(state, everyone, 0, given_of(""))
  if args.order == "cyclic" and not (np.asarray(served)[0] == order).all():
    sys.exit(f"trace_jsfl: the engine served {np.asarray(served)[0]}, expected {order}")
  dump.update(idx=np.asarray(idx), mask=np.asarray(mask), order=order)
  for k in ks:
    live = jnp.asarray(np.isin(np.arange(len(order)), order[:k]))
    _, server, *_ = run(state, live, 0, given_of(""))
    record(f"k{k}:", c, server.params, server.stats)
  dump["steps"] = np.asarray(ks)
  dump["rounds"] = np.asarray(args.rounds)
  dump["policy"] = np.asarray(args.order)
  for r in range(args.rounds):
    state, _, idx, mask, _, seq, same = run(state, everyone, r, given_of(f"_r{r}"))
    if not bool(same):
      sys.exit(f"trace_jsfl: round {r}'s serving sequence is not the engine's")
    dump.update({f"idx_r{r}": np.asarray(idx), f"mask_r{r}": np.asarray(mask),
                 f"seq_r{r}": np.asarray(seq)})
    record(f"r{r}:", 0, *sfl.output_model(setup, state))
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  np.savez(args.out, **dump)
  print(f"trace_jsfl: {'float64' if args.x64 else 'float32'}, server after steps {ks} "
        f"-> {args.out}")


if __name__ == "__main__":
  main()
