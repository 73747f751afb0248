"""Scaling of jsfl's SFL round with clients, seeds and devices.

Three curves of samples/s of one jitted SFL round (synthetic CIFAR-shaped
data, 32x32x3, 10 classes, every client holding ``--steps * --batch``
samples, full participation), each point with its compile time and peak
memory:

* **clients**: ``--clients`` (10, 100, 1000) at ``--clients-seeds`` seeds;
* **seeds**: ``--seeds`` (1 .. 32) at ``--seeds-clients`` clients, all seeds
  in one program (``seed_program``, the backend's ``seed_exec`` unless
  ``--seed-exec``);
* **devices**: D in ``--devices`` (1, 2, 4, 8) with ``D * --seeds-per-device``
  seeds: the seed axis of the state, the keys and the per-seed data is put on
  the library's ``("seeds", "clients")`` mesh (``jsfl.core.sharding``, seed
  axis D, shared data replicated) before the jitted, vmapped round, so
  jit partitions the seeds over the devices (no pmap).  Where the backend has
  fewer than D devices the point runs on D simulated host devices
  (``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count=D``),
  which checks the mechanism but shares the same cores: on a CPU it cannot
  speed anything up.

Every point runs in its own subprocess (its compile time and peak memory are
its own; the devices curve needs it for ``XLA_FLAGS``).  The workers of one
curve are started and compiled one after another, then, on a CPU, timed
round-robin (point 1, point 2, ..., point 1, ...) for ``--repeats`` passes,
so a load that changes over time hits all points of a curve alike; on an
accelerator each point is timed and closed before the next starts
(``--interleave``); medians are reported.  Peak memory: the sum over devices of jax's ``peak_bytes_in_use``
where the backend reports it, else the worker's peak RSS.

Writes ``benchmarks/results/scaling-<backend>-<host>-<time>.json`` and a PNG
with one panel per curve.

Usage::

  python benchmarks/scaling.py                       # GPU sizes: MobileNetV1, batch 64
  python benchmarks/scaling.py --model small_cnn --width 8 --batch 16   # small CPU
"""

from __future__ import annotations

import os

# Workers share an accelerator; jax would preallocate 75% of it in each.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import json
import sys
import time

import _results  # a sibling module, as interleave below
import jax

HERE = os.path.dirname(os.path.abspath(__file__))
import interleave  # benchmarks/ is not a package: sibling modules (script dir on sys.path)
import throughput

from jsfl import train
from jsfl.core import sharding
from jsfl.core.clients import CLIENT_EXECS
from jsfl.core.data import RoundData
from jsfl.methods import sfl
from jsfl.train.programs import default_seed_exec, make_seed_keys, round_keys, seed_program

COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute",
               "reduce-scatter")


# ------------------------------------------------------------------ worker
def place_on_seed_mesh(per_seed, shared, devices):
  """Per-seed leaves on the library's ``("seeds", "clients")`` mesh over
  ``devices`` (seed axis sharded, client axis 1), ``shared`` replicated:
  the placement ``jsfl run`` uses (:mod:`jsfl.core.sharding`)."""
  mesh = sharding.make_mesh((len(devices), 1), devices)
  return (sharding.put(per_seed, sharding.seed_sharding(mesh)),
          sharding.put(shared, sharding.replicated(mesh)))


def _peak_memory() -> dict:
  stats = [d.memory_stats() for d in jax.local_devices()]
  if all(s and "peak_bytes_in_use" in s for s in stats):
    peaks = [s["peak_bytes_in_use"] for s in stats]
    return {"kind": "jax peak_bytes_in_use, summed over devices",
            "peak_bytes": int(sum(peaks)), "per_device_max_bytes": int(max(peaks))}
  return {"kind": "worker process peak RSS (incl. compilation)",
          "peak_bytes": interleave.rss_peak_bytes()}


def model_options(args) -> dict:
  if args.width is None:
    return {}
  # small_cnn's width is its first layer's channel count, the others' a multiplier.
  return {"width": int(args.width) if args.model == "small_cnn" else args.width}


def worker(args, point: dict) -> None:
  """Builds and compiles one point, then answers ``time`` / ``stats`` / ``quit``."""
  clients, seeds, n_dev = point["clients"], point["seeds"], point["devices"]
  n_per = args.steps * args.batch
  setup = train.setup_from({
      "model": {"name": args.model, **model_options(args)},
      "partition": {"num_clients": clients},
      "method": {"name": "sfl", "batch_size": args.batch},
      "optim": {"lr": args.lr, "momentum": args.momentum, "weight_decay": args.weight_decay},
      "exec": {"client_exec": args.client_exec}}, (32, 32, 3), 10, n_per)
  shared, per_seed = throughput.workload(args, clients, seeds)
  how = point["seed_exec"]

  def one(state, sd, key, sh):
    return sfl.round(setup, state, RoundData(**sh, **sd), key)

  init = jax.jit(seed_program(lambda k: sfl.init(setup, k), how, 1))
  rnd = jax.jit(seed_program(one, how, 3), donate_argnums=(0,))
  seed_keys = make_seed_keys(range(seeds))
  keys = [round_keys(seed_keys, r) for r in range(args.repeats + 2)]
  state = init(seed_keys)
  if point["axis"] == "devices":
    (state, per_seed, keys), shared = place_on_seed_mesh(
        (state, per_seed, keys), shared, jax.devices()[:n_dev])
  jax.block_until_ready(state)
  t = time.perf_counter()
  compiled = rnd.lower(state, per_seed, keys[0], shared).compile()
  compile_s = time.perf_counter() - t
  hlo = compiled.as_text() or ""
  box = {"state": state, "r": 0}

  def call():
    k = keys[box["r"] % len(keys)]
    box["state"], metrics = compiled(box["state"], per_seed, k, shared)
    jax.block_until_ready((box["state"], metrics))
    box["r"] += 1

  out_sharding = jax.tree.leaves(compiled.output_shardings)[0]
  ready = {"compile_s": compile_s, "platform": jax.devices()[0].platform,
           "state_devices": len(out_sharding.device_set),
           "state_spec": str(getattr(out_sharding, "spec", None)),
           "collectives_in_hlo": {c: hlo.count(f" {c}(") for c in COLLECTIVES}}
  interleave.serve(call, ready, _peak_memory)


# ------------------------------------------------------------------ parent
def run_curve(args, argv, points: list[dict]) -> list[dict]:
  """Compiles every point's worker in turn, then times them round-robin.

  With ``--interleave off`` each point is timed and closed before the next
  starts: on a GPU every live worker keeps its peak allocation, and a
  curve's workers together could exhaust it.
  """
  samples = {i: p["seeds"] * p["clients"] * args.steps * args.batch
             for i, p in enumerate(points)}
  workers, ready, out = {}, {}, {}
  for i, p in enumerate(points):
    env = dict(os.environ)
    if p["simulated"]:
      env["JAX_PLATFORMS"] = "cpu"
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={p['devices']}").strip()
    workers[i] = interleave.Worker(
        [sys.executable, os.path.join(HERE, "scaling.py"), *argv, "--worker", json.dumps(p)],
        env)
    ready[i] = workers[i].reply()
    print(f"  [{p['axis']}] clients={p['clients']} seeds={p['seeds']} "
          f"devices={p['devices']}: " + (ready[i].get("error") or
                                         f"compiled in {ready[i]['compile_s']:.1f} s"),
          flush=True)
    if args.interleave == "off":
      out.update(interleave.time_round_robin({i: workers.pop(i)}, {i: ready[i]},
                                             args.repeats, samples))
  out.update(interleave.time_round_robin(workers, {i: ready[i] for i in workers},
                                         args.repeats, samples))
  return [dict(p, samples_per_round=samples[i], **out[i]) for i, p in enumerate(points)]


def plot(res: dict, path: str) -> None:
  """Three panels (clients, seeds, devices): samples/s and compile time."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
  for ax, axis, xlabel in zip(axes, ("clients", "seeds", "devices"),
                              ("clients", "seeds (one program)", "devices (seeds = D x k)")):
    rows = [r for r in res["rows"] if r["axis"] == axis and "error" not in r]
    if not rows:
      ax.set_title(f"{axis}: no points")
      continue
    x = [r[axis] for r in rows]
    ax.plot(x, [r["samples_per_s"] for r in rows], "o-", label="samples/s")
    for r in rows:
      ax.annotate(f"{r['memory']['peak_bytes'] / 2**20:,.0f} MiB", (r[axis], r["samples_per_s"]),
                  textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xscale("log", base=2 if axis != "clients" else 10)
    ax.set_xticks(x, [str(v) for v in x])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, 1.2 * max(r["samples_per_s"] for r in rows))  # room for the labels
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples/s")
    tw = ax.twinx()
    tw.plot(x, [r["compile_s"] for r in rows], "s--", color="tab:red", alpha=0.6,
            label="compile s")
    tw.set_ylabel("compile (s)", color="tab:red")
    tw.set_ylim(0, 1.2 * max(r["compile_s"] for r in rows))
    lines = ax.get_lines()[:1] + tw.get_lines()[:1]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=7)
    fixed = {"clients": f"{rows[0]['seeds']} seed(s)",
             "seeds": f"{rows[0]['clients']} clients",
             "devices": f"{rows[0]['clients']} clients, "
                        f"{'simulated ' if rows[0]['simulated'] else ''}{rows[0]['platform']}"}
    ax.set_title(f"SFL round vs {axis} ({fixed[axis]})", fontsize=9)
  a = res["args"]
  fig.suptitle(f"{res['machine']['backend']} ({res['machine']['device']}, "
               f"{res['machine']['cpus']} CPUs): {a['model']} width {a['width']}, batch "
               f"{a['batch']}, {a['steps']} step(s); peak memory annotated", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="mobilenet_v1")
  ap.add_argument("--width", type=float, default=None,
                  help="model width (a multiplier; small_cnn: first layer's channels)")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=1, help="batch steps per round")
  ap.add_argument("--lr", type=float, default=0.01)
  ap.add_argument("--momentum", type=float, default=0.5)
  ap.add_argument("--weight-decay", type=float, default=1e-4)
  ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
  ap.add_argument("--clients-seeds", type=int, default=1, help="seeds on the clients curve")
  ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
  ap.add_argument("--seeds-clients", type=int, default=10, help="clients on the seeds curve")
  ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
  ap.add_argument("--devices-clients", type=int, default=10,
                  help="clients on the devices curve")
  ap.add_argument("--seeds-per-device", type=int, default=2)
  ap.add_argument("--curves", nargs="+", default=["clients", "seeds", "devices"],
                  choices=("clients", "seeds", "devices"))
  ap.add_argument("--seed-exec", default="auto", choices=("auto", "vmap", "map"),
                  help="seed axis on the clients and seeds curves (auto: "
                  "default_seed_exec); the devices curve always vmaps")
  ap.add_argument("--client-exec", default="vmap", choices=CLIENT_EXECS)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--interleave", default="auto", choices=("auto", "on", "off"),
                  help="time a curve's points round-robin with all workers alive (auto: "
                  "on for CPU, where the load varies; off on accelerators, where live "
                  "workers would hold device memory)")
  interleave.add_run_args(ap, _results.DIR)
  argv = sys.argv[1:] if argv is None else list(argv)
  args = ap.parse_args(argv)
  if args.worker:
    worker(args, json.loads(args.worker))
    return None

  if args.interleave == "auto":
    args.interleave = "on" if jax.default_backend() == "cpu" else "off"
  argv = argv + ["--interleave", args.interleave]
  how = default_seed_exec() if args.seed_exec == "auto" else args.seed_exec
  n_real = jax.device_count()
  curves = {
      "clients": [{"clients": c, "seeds": args.clients_seeds, "devices": 1,
                   "seed_exec": how} for c in args.clients],
      "seeds": [{"clients": args.seeds_clients, "seeds": s, "devices": 1,
                 "seed_exec": how} for s in args.seeds],
      # vmap: a rolled lax.map over the sharded seed axis would not partition.
      "devices": [{"clients": args.devices_clients, "seeds": d * args.seeds_per_device,
                   "devices": d, "seed_exec": "vmap"} for d in args.devices],
  }
  load_start, t_start = interleave.load_average(), time.time()
  res = {"machine": _results.machine(), "args": vars(args), "rows": []}
  print(f"# {res['machine']}", flush=True)
  for axis in args.curves:
    points = [dict(p, axis=axis, simulated=(axis == "devices" and (
        jax.default_backend() == "cpu" or p["devices"] > n_real))) for p in curves[axis]]
    print(f"{axis} curve:", flush=True)
    res["rows"] += run_curve(args, argv, points)
  res["load_note"] = (
      f"{args.load_note + '; ' if args.load_note else ''}points of a curve timed "
      f"{'round-robin' if args.interleave == 'on' else 'one after another'}, medians of "
      f"{args.repeats}; 1/5/15-min load average at start "
      f"{load_start}, at end {interleave.load_average()}, on {os.cpu_count()} CPUs")
  res["wall_s"] = time.time() - t_start

  print("\n| curve | clients | seeds | devices | samples/s | compile (s) | peak MiB | "
        "collectives |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in res["rows"]:
    if "error" in r:
      print(f"| {r['axis']} | {r['clients']} | {r['seeds']} | {r['devices']} | "
            f"error: {r['error'][:80]} |")
      continue
    coll = sum(r["collectives_in_hlo"].values())
    print(f"| {r['axis']} | {r['clients']} | {r['seeds']} | {r['devices']} | "
          f"{r['samples_per_s']:,.0f} | {r['compile_s']:.1f} | "
          f"{r['memory']['peak_bytes'] / 2**20:,.0f} | {coll} |")
  interleave.write_results(res, args.out, "scaling", plot)
  return res


if __name__ == "__main__":
  main()
