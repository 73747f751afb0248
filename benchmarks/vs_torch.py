"""jsfl's jitted rounds against the papers' PyTorch per-client loop.

For each method in (sfl, hydra, multisfl) and model in (mobilenet_v1,
resnet18): the same synthetic CIFAR-shaped workload (32x32x3, 10 classes, the
same images and client index table on both sides), batch ``--batch``,
``--clients`` clients each holding ``--steps * --batch`` samples (every client
participates, so a round is ``--steps`` batch steps of every client), SGD
with momentum and weight decay, for each seed count of ``--seeds``:

* **jsfl**: ``method.round`` for all seeds in one jitted program
  (``seed_program``, the backend's default ``seed_exec`` unless
  ``--seed-exec``), the state donated and chained from call to call as
  ``jsfl run`` does; its compile time is reported apart from the first call;
* **torch**: ``benchmarks/torch_loop.py``, eager PyTorch with one Python call
  per client batch, seeds as an outer loop (how the papers' code runs several
  seeds).

MultiSFL runs without knowledge replay on both sides (jsfl ``replay="off"``,
the paper's ablation Conf1): the replay bookkeeping would have to be
reimplemented in the loop first.  Hydra uses jsfl's default head cut and G =
10 heads, grouped by jsfl's Algorithm 2 on the clients' label counts (the
torch loop gets the same grouping).  ``--central`` adds, per model, one
whole-model SGD step at batch ``--batch`` without any split in both
frameworks (and in jax with XLA's own convolutions where jsfl's default
lowering differs): how far apart the two frameworks' kernels are.

Each side runs in a worker process of its own (``benchmarks/interleave.py``):
the jsfl worker compiles, then the torch worker warms up, then their calls
are interleaved (jsfl, torch, jsfl, torch, ...) for ``--repeats`` rounds and
each side's median is reported, so a load that varies over time hits both
alike; compile time and peak memory are each process's own (jax
``peak_bytes_in_use`` / ``torch.cuda.max_memory_allocated`` on a GPU, the
worker's peak RSS on a CPU).

Writes ``benchmarks/results/vs_torch-<backend>-<host>-<time>.json`` and a PNG
bar chart of samples/s next to it.

Usage::

  pip install -e '.[bench]'
  python benchmarks/vs_torch.py --central            # GPU sizes: 100 clients, 8 seeds
  python benchmarks/vs_torch.py --width 0.25 --clients 10 --seeds 2 --torch-threads 1  # 2-core CPU
"""

from __future__ import annotations

import os

# jax preallocates 75% of a GPU by default; the torch worker shares it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import json
import sys
import tempfile
import time

import _results  # a sibling module, as interleave below
import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
import interleave  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

from jsfl import train
from jsfl.core.clients import CLIENT_EXECS
from jsfl.core.data import RoundData
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.optim import make_optimizer, with_lr
from jsfl.core.setup import Setup
from jsfl.data import load_dataset
from jsfl.methods import hydra
from jsfl.methods.catalog import get_method
from jsfl.models import get_model, layers
from jsfl.train.programs import default_seed_exec, make_seed_keys, round_keys, seed_program

METHODS = ("sfl", "hydra", "multisfl")       # torch_loop.METHODS
MODELS = ("mobilenet_v1", "resnet18")        # torch_loop.MODELS
REPLAY_NOTE = ("MultiSFL without knowledge replay on both sides (jsfl replay='off', "
               "the paper's ablation Conf1)")
TORCH_NOTE = ("torch loop: eager PyTorch, one Python call per client batch, seeds as an "
              "outer loop; favourable to torch: data resident on the device, batches "
              "sliced from one shuffled index table per round, no per-step .item()")


# ------------------------------------------------------------------ worker
def make_setup(args, method: str, model: str) -> Setup:
  """jsfl's static run description of the workload, from a config as
  ``jsfl run`` builds it."""
  return train.setup_from({
      "model": {"name": model, "width": args.width},
      "partition": {"num_clients": args.clients},
      "method": {"name": method, "batch_size": args.batch,
                 **({"replay": "off"} if method == "multisfl" else {})},
      "optim": {"lr": args.lr, "momentum": args.momentum,
                "weight_decay": args.weight_decay},
      "exec": {"client_exec": args.client_exec}},
      (32, 32, 3), 10, args.steps * args.batch)


def jsfl_round(args, method: str, model: str, data_path: str, seeds: int):
  """Compiles the seed program of one round; returns ``(call, compile_s)``."""
  d = np.load(data_path)
  K, n_per = args.clients, args.steps * args.batch
  shared = {"x": jnp.asarray(d["x"]), "y": jnp.asarray(d["y"]),
            "mean": jnp.asarray(d["mean"]), "std": jnp.asarray(d["std"])}
  per_seed = {"table": jnp.broadcast_to(d["table"], (seeds,) + d["table"].shape),
              "sizes": jnp.full((seeds, K), n_per, jnp.int32),
              "dominant": jnp.broadcast_to(d["counts"].argmax(1).astype(np.int32),
                                           (seeds, K)),
              "counts": jnp.broadcast_to(d["counts"], (seeds,) + d["counts"].shape)}
  setup = make_setup(args, method, model)
  mod = get_method(method)
  how = default_seed_exec() if args.seed_exec == "auto" else args.seed_exec

  def one(state, sd, key, sh):
    return mod.round(setup, state, RoundData(**sh, **sd), key)

  init = jax.jit(seed_program(lambda k: mod.init(setup, k), how, 1))
  rnd = jax.jit(seed_program(one, how, 3), donate_argnums=(0,))
  seed_keys = make_seed_keys(range(seeds))
  box = {"state": init(seed_keys), "r": 0}
  jax.block_until_ready(box["state"])
  t = time.perf_counter()
  compiled = rnd.lower(box["state"], per_seed, round_keys(seed_keys, 0),
                       shared).compile()
  compile_s = time.perf_counter() - t

  def call():
    keys = round_keys(seed_keys, box["r"])
    box["state"], metrics = compiled(box["state"], per_seed, keys, shared)
    jax.block_until_ready((box["state"], metrics))
    box["r"] += 1

  return call, compile_s


def jax_central(args, model: str, model_kw: dict):
  """``--central-steps`` jitted whole-model SGD steps at batch ``--batch``."""
  B = args.batch
  x = jax.random.normal(jax.random.key(1), (B, 32, 32, 3))
  y = jax.random.randint(jax.random.key(2), (B,), 0, 10)
  mask = jnp.ones((B,), bool)
  m = get_model(model, (32, 32, 3), 10, width=args.width, **model_kw)
  tx = make_optimizer(args.momentum, args.weight_decay)
  p, s = m.init(jax.random.key(0))

  def step(p, s, o):
    def loss(q):
      logits, ns = m.apply(q, s, x, train=True, mask=mask)
      return masked_cross_entropy(logits, y, mask), ns
    (_, ns), g = jax.value_and_grad(loss, has_aux=True)(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), ns, o

  box = [p, s, with_lr(tx.init(p), args.lr)]
  t = time.perf_counter()
  f = jax.jit(step, donate_argnums=(0, 1, 2)).lower(*box).compile()
  compile_s = time.perf_counter() - t

  def call():
    for _ in range(args.central_steps):
      box[:] = f(*box)
    jax.block_until_ready(box)

  return call, compile_s


def jsfl_worker(args, spec: dict) -> None:
  """Builds the jax side of ``spec`` and serves timing requests."""
  if spec["what"] == "central":
    call, compile_s = jax_central(args, spec["model"], spec["model_kw"])
  else:
    call, compile_s = jsfl_round(args, spec["method"], spec["model"], spec["data"],
                                 spec["seeds"])

  def memory():
    stats = jax.devices()[0].memory_stats()
    if stats and "peak_bytes_in_use" in stats:
      return {"kind": "jax peak_bytes_in_use", "peak_bytes": stats["peak_bytes_in_use"]}
    return {"kind": "worker process peak RSS (incl. compilation)",
            "peak_bytes": interleave.rss_peak_bytes()}

  interleave.serve(call, {"compile_s": compile_s}, memory)


# ------------------------------------------------------------------ parent
def write_workload(args, path: str):
  """The synthetic data and index table both sides load; returns the counts."""
  K, n_per = args.clients, args.steps * args.batch
  ds = load_dataset("synthetic", input_shape=(32, 32, 3), num_classes=10,
                    train_size=K * n_per, test_size=10, seed=0)
  table = np.arange(K * n_per, dtype=np.int32).reshape(K, n_per)
  y = np.asarray(ds.y_train)
  counts = np.stack([np.bincount(y[row], minlength=10) for row in table]).astype(np.int32)
  np.savez(path, x=ds.x_train, y=y, mean=ds.mean, std=ds.std, table=table, counts=counts)
  return counts


def _torch_spec(args, what: str, method: str, model: str, seeds: int, data: str,
                groups=None) -> dict:
  return {"what": what, "method": method, "seeds": seeds, "data": data,
          "device": args.torch_device, "threads": args.torch_threads,
          "central_steps": args.central_steps,
          "config": {"model": model, "num_clients": args.clients,
                     "batch_size": args.batch, "width": args.width, "lr": args.lr,
                     "momentum": args.momentum, "weight_decay": args.weight_decay,
                     "groups": groups, "channels_last": args.torch_channels_last == "on"}}


def run_pair(args, argv, jax_specs: dict, torch_spec: dict, samples: int) -> dict:
  """Starts the jax workers, then the torch one, then times them interleaved."""
  workers, ready = {}, {}
  for name, spec in jax_specs.items():
    workers[name] = interleave.Worker([sys.executable, os.path.join(HERE, "vs_torch.py"),
                                       *argv, "--worker", json.dumps(spec)])
    ready[name] = workers[name].reply()
  workers["torch"] = interleave.Worker([sys.executable, os.path.join(HERE, "torch_loop.py"),
                                        "--serve", json.dumps(torch_spec)])
  ready["torch"] = workers["torch"].reply()
  return interleave.time_round_robin(workers, ready, args.repeats,
                                     dict.fromkeys(workers, samples))


def _row(base_row: dict, sides: dict) -> dict:
  row = dict(base_row, **sides)
  errors = [f"{k}: {v['error']}" for k, v in sides.items() if "error" in v]
  if errors:
    row["error"] = "; ".join(errors)
  else:
    row["ratio"] = sides["torch"]["round_s"] / sides["jsfl"]["round_s"]
  return row


def machine(torch_device: str) -> dict:
  import torch
  return _results.machine(torch=torch.__version__, torch_device=torch_device,
                          torch_device_name=(torch.cuda.get_device_name()
                                             if torch_device.startswith("cuda")
                                             else _results.cpu_model()))


def plot(res: dict, path: str) -> None:
  """Bar chart: samples/s of jsfl and torch per row, the ratio on top."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = [r for r in res["rows"] if "error" not in r]
  if not rows:
    return
  labels = [f"{r['method']}\n{r['model']}\n" + (
      f"{r['seeds']} seed{'s' * (r['seeds'] > 1)}" if r["method"] != "central"
      else f"1 model, batch {r['batch']}") for r in rows]
  x = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
  j = [r["jsfl"]["samples_per_s"] for r in rows]
  t = [r["torch"]["samples_per_s"] for r in rows]
  ax.bar(x - 0.2, j, 0.4, label="jsfl: one jitted round, all seeds (central: jitted step)")
  ax.bar(x + 0.2, t, 0.4, label="PyTorch per-client loop (central: eager step)")
  for xi, r, h in zip(x, rows, np.maximum(j, t)):
    ax.text(xi, h, f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
  ax.set_xticks(x, labels, fontsize=7)
  ax.set_ylabel("samples/s")
  ax.set_ylim(0, 1.15 * max(max(j), max(t)))
  m, a = res["machine"], res["args"]
  ax.set_title(f"{m['backend']} ({m['device']}, {m['cpus']} CPUs), torch {m['torch_device']} "
               f"x{a['torch_threads']} threads: {a['clients']} clients, batch {a['batch']}, "
               f"{a['steps']} step(s), width {a['width']}", fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def print_table(res: dict) -> None:
  print("\n| method | model | seeds | jsfl samples/s | torch samples/s | jsfl/torch | "
        "jsfl compile (s) | jsfl peak MiB | torch peak MiB |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in res["rows"]:
    if "error" in r:
      print(f"| {r['method']} | {r['model']} | {r['seeds']} | error: {r['error'][:100]} |")
      continue
    j, t = r["jsfl"], r["torch"]
    print(f"| {r['method']} | {r['model']} | {r['seeds']} | {j['samples_per_s']:,.0f} | "
          f"{t['samples_per_s']:,.0f} | {r['ratio']:.2f} | {j['compile_s']:.1f} | "
          f"{j['memory']['peak_bytes'] / 2**20:,.0f} | "
          f"{t['memory']['peak_bytes'] / 2**20:,.0f} |")
  for r in res["rows"]:
    if "jax_xla_conv" in r and "error" not in r:
      print(f"\ncentral {r['model']}: jax with XLA's convolutions "
            f"{r['jax_xla_conv']['samples_per_s']:,.0f} samples/s (jsfl's default "
            f"lowering {r['jsfl']['samples_per_s']:,.0f}; torch "
            f"{r['torch']['samples_per_s']:,.0f})")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS,
                  help="methods to compare (none with --central: only the central rows)")
  ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
  ap.add_argument("--clients", type=int, default=100)
  ap.add_argument("--seeds", type=int, nargs="+", default=[8],
                  help="seed counts to time (jsfl: one program; torch: an outer loop)")
  ap.add_argument("--steps", type=int, default=1, help="batch steps per round")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--width", type=float, default=1.0, help="channel multiplier of both models")
  ap.add_argument("--lr", type=float, default=0.01)
  ap.add_argument("--momentum", type=float, default=0.5)
  ap.add_argument("--weight-decay", type=float, default=1e-4)
  ap.add_argument("--repeats", type=int, default=3, help="timed calls per side after the first")
  ap.add_argument("--seed-exec", default="auto", choices=("auto", "vmap", "map"),
                  help="jsfl's seed axis (auto: default_seed_exec)")
  ap.add_argument("--client-exec", default="vmap", choices=CLIENT_EXECS,
                  help="jsfl's client axis (vmap: the config default)")
  ap.add_argument("--central", action="store_true",
                  help="also time a whole-model SGD step (no split) per model in jax and "
                  "torch: how far apart the two frameworks' kernels are")
  ap.add_argument("--central-steps", type=int, default=5, help="steps per timed central call")
  ap.add_argument("--torch-device", default="auto", help="auto: cuda where available, else cpu")
  ap.add_argument("--torch-channels-last", default="auto", choices=("auto", "on", "off"),
                  help="NHWC memory format in the torch loop (auto: on for CPU, where it "
                  "measured 1.1-1.5x faster; off on GPU, not measured)")
  ap.add_argument("--torch-threads", type=int, default=os.cpu_count(),
                  help="torch.set_num_threads (on a loaded CPU 1 can be much faster: "
                  "see benchmarks/README.md)")
  interleave.add_run_args(ap, _results.DIR)
  argv = sys.argv[1:] if argv is None else list(argv)
  args = ap.parse_args(argv)
  if args.worker:
    jsfl_worker(args, json.loads(args.worker))
    return None
  if args.torch_device == "auto":
    import torch
    args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
  if args.torch_channels_last == "auto":
    args.torch_channels_last = "off" if args.torch_device.startswith("cuda") else "on"
  # The workers get the resolved choices.
  argv = argv + ["--torch-device", args.torch_device,
                 "--torch-channels-last", args.torch_channels_last]

  load_start, t_start = interleave.load_average(), time.time()
  res = {"machine": machine(args.torch_device), "args": vars(args),
         "jsfl_seed_exec": (default_seed_exec() if args.seed_exec == "auto"
                            else args.seed_exec),
         "jsfl_lowering": {"conv_impl": layers.default_conv_impl(),
                           "depthwise_impl": layers.default_depthwise_impl()},
         "replay": REPLAY_NOTE, "torch_loop": TORCH_NOTE, "rows": []}
  print(f"# {res['machine']}", flush=True)
  with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "workload.npz")
    counts = write_workload(args, data)
    for method in args.methods:
      for model in args.models:
        groups = None
        if method == "hydra":
          groups = [int(g) for g in np.asarray(
              hydra.groups_of(make_setup(args, method, model), counts))]
        for seeds in sorted(args.seeds):
          n = seeds * args.clients * args.steps * args.batch
          spec = {"what": "round", "method": method, "model": model, "seeds": seeds,
                  "data": data}
          sides = run_pair(args, argv, {"jsfl": spec},
                           _torch_spec(args, "round", method, model, seeds, data, groups), n)
          row = _row({"method": method, "model": model, "seeds": seeds,
                      "clients": args.clients, "steps": args.steps, "batch": args.batch,
                      "samples_per_round": n}, sides)
          res["rows"].append(row)
          interleave.write_partial(res, args.out, "vs_torch")
          print(f"[{method} {model} seeds={seeds}] " + (row.get("error") or (
              f"jsfl {row['jsfl']['samples_per_s']:,.0f} / torch "
              f"{row['torch']['samples_per_s']:,.0f} samples/s = {row['ratio']:.2f}x")),
              flush=True)
    for model in args.models if args.central else []:
      specs = {"jsfl": {"what": "central", "model": model, "model_kw": {}}}
      if layers.default_conv_impl() != "xla":
        specs["jax_xla_conv"] = {"what": "central", "model": model, "model_kw": {
            "conv_impl": "xla", "depthwise_impl": "grouped"}}
      n = args.central_steps * args.batch
      sides = run_pair(args, argv, specs, _torch_spec(args, "central", "", model, 1, data), n)
      row = _row({"method": "central", "model": model, "seeds": 1, "clients": 1,
                  "steps": args.central_steps, "batch": args.batch,
                  "samples_per_round": n}, sides)
      res["rows"].append(row)
      interleave.write_partial(res, args.out, "vs_torch")
      print(f"[central {model}] " + (row.get("error") or ", ".join(
          f"{k} {v['samples_per_s']:,.0f}" for k, v in sides.items()) + " samples/s"),
          flush=True)
  res["load_note"] = (
      f"{args.load_note + '; ' if args.load_note else ''}each side in its own worker "
      f"process, calls interleaved (jsfl, torch, jsfl, torch, ...), medians of "
      f"{args.repeats}; 1/5/15-min load average at start {load_start}, at end "
      f"{interleave.load_average()}, on {os.cpu_count()} CPUs")
  res["wall_s"] = time.time() - t_start
  print_table(res)
  interleave.write_results(res, args.out, "vs_torch", plot)
  return res


if __name__ == "__main__":
  main()
