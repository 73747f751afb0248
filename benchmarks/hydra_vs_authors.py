"""Speed of SFL, Hydra and MultiSFL rounds, jsfl against the authors' code.

The cells are those of the Hydra cross-check (``experiments/hydra/authors.toml``):
Fashion-MNIST, the 6,000-image subset, 80%-DL, 10 clients, batch 64, small
CNN cut 2 (``--model mobilenet``: MobileNetV1 width 0.5, cut 4); and
``--model multisfl``: MultiSFL in its authors' setting
(``experiments/multisfl/fmnist_authors.toml``, their code through
``experiments/multisfl/authors_code/run.sh``).  Per cell
and repeat the two sides run one after the other (authors, jsfl, authors,
jsfl, ...), so a load that changes hits both alike:

* the authors' code through ``experiments/hydra/authors_code/run.sh`` (the
  adapted clone, one torch thread, one seed; ``--procs N``: N such processes
  side by side, seeds 0..N-1): its round log gives training samples over
  training seconds (``train_s``: round start to evaluation);
* jsfl through ``jsfl run`` with the same cell (``--seeds`` seeds as the
  slots of one program, the default execution): samples over ``wall_s`` of
  rounds 2.. (round 1 compiles; evaluation is outside ``wall_s``).

Reported per side: training samples per second per seed; the whole
process's wall time per seed-run (start-up, data, compilation, every
round's training and evaluation: what a user waits for), from which
seed-runs per hour on one process follow; CPU-seconds per seed-round (the
process tree's user + system time over seeds x rounds: what a core-bound
machine pays); and the time from the process's start to its first
finished round (its first round record on disk); and the training FLOP/s
that the samples per second give (XLA's FLOP count of one training step per
sample, times samples per second, times the seeds or processes training
side by side), against a measured f32 matmul peak.

    python benchmarks/hydra_vs_authors.py --cells sfl_cyclic hydra_cyclic --rounds 5
    # equal cores: their code as one process per core, jsfl with 5 seeds a program
    python benchmarks/hydra_vs_authors.py --procs 2 --seeds 5 --rounds 15
    python benchmarks/hydra_vs_authors.py --procs 2 --seeds 5 --rounds 15 --cache warm
    python benchmarks/hydra_vs_authors.py --model mobilenet --rounds 3
    # MultiSFL in its authors' setting (their recipe in experiments/multisfl/authors_code/)
    python benchmarks/hydra_vs_authors.py --model multisfl --procs 2 --seeds 5 --rounds 5

Writes ``results/hydra_vs_authors-<model>-<host>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RECIPE = os.path.join(ROOT, "experiments/hydra/authors_code/run.sh")
MULTISFL_RECIPE = os.path.join(ROOT, "experiments/multisfl/authors_code/run.sh")
CONFIGS = {"small_cnn": "experiments/hydra/fmnist.toml",
           "mobilenet": "experiments/hydra/fmnist_mobilenet.toml",
           "multisfl": "experiments/multisfl/fmnist_authors.toml"}
CLONES = {"small_cnn": "/work/authors/Hydra", "mobilenet": "/work/authors/Hydra",
          "multisfl": "/work/authors/MultiSFL"}
# run.sh's cell -> the jsfl overrides of the same cell (authors.toml); the
# multisfl "model" is MultiSFL's own setting (its authors' recipe, small CNN
# with BatchNorm, 100 clients, 10 a round, E = 5, full Fashion-MNIST).
CELLS = {
    "sfl_cyclic": ["method.name=sfl", "method.order=cyclic"],
    "sfl_random": ["method.name=sfl", "method.order=random"],
    "hydra_cyclic": ["method.name=hydra", "method.order=cyclic"],
    "hydra_random": ["method.name=hydra", "method.order=random"],
    "multisfl": ["method.name=multisfl"],
}
MODEL_CELLS = {"small_cnn": ("sfl_cyclic", "sfl_random", "hydra_cyclic", "hydra_random"),
               "mobilenet": ("sfl_cyclic", "sfl_random", "hydra_cyclic", "hydra_random"),
               "multisfl": ("multisfl",)}


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def has_record(path: str) -> bool:
  try:
    with open(path) as f:
      return any(line.endswith("\n") and line.strip() for line in f)
  except OSError:
    return False


def timed(jobs: list[tuple[list[str], str, dict]]) -> tuple[float, list[float], float]:
  """Runs the ``(cmd, log, popen kwargs)`` jobs side by side; returns the
  wall seconds until the last ends, each job's seconds to the first line of
  its ``log``, and their CPU seconds (user + system, children included)."""
  t0 = time.perf_counter()
  procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, **kw) for cmd, _, kw in jobs]
  first: list[float | None] = [None] * len(jobs)
  live, cpu = {p.pid: i for i, p in enumerate(procs)}, 0.0
  while live:
    for pid, i in list(live.items()):
      done, status, usage = os.wait4(pid, os.WNOHANG)
      if done:
        del live[pid]
        cpu += usage.ru_utime + usage.ru_stime
        procs[i].returncode = os.waitstatus_to_exitcode(status)
      elif first[i] is None and has_record(jobs[i][1]):
        first[i] = time.perf_counter() - t0
    time.sleep(0.05)
  total = time.perf_counter() - t0
  for p, (cmd, _, _) in zip(procs, jobs, strict=True):
    if p.returncode:
      raise subprocess.CalledProcessError(p.returncode, cmd)
  return total, [total if f is None else f for f in first], cpu


def authors_run(cell: str, model: str, rounds: int, clone: str, py: str,
                procs: int = 1) -> dict:
  """``procs`` one-thread processes side by side (seeds 0..procs-1), as a
  user fills a machine with their code."""
  with tempfile.TemporaryDirectory() as tmp:
    jobs = []
    for seed in range(procs):
      env = dict(os.environ, MODEL=model, ROUNDS=str(rounds), SEEDS=str(seed), CELLS=cell,
                 CLONE=clone, PY=py, THREADS="1")
      out = os.path.join(tmp, str(seed))
      if model == "multisfl":  # its recipe: LOG_DIR/MultiSFL_seed<S>.jsonl
        env["ALGOS"] = "MultiSFL"
        jobs.append((["bash", MULTISFL_RECIPE, out],
                     os.path.join(out, f"MultiSFL_seed{seed}.jsonl"), {"env": env}))
        continue
      jobs.append((["bash", RECIPE, out], os.path.join(out, model, f"{cell}_seed{seed}.jsonl"),
                   {"env": env}))
    total, first, cpu = timed(jobs)
    runs = [read_jsonl(log) for _, log, _ in jobs]
  speeds = [sum(r["samples"] for r in recs) / sum(r["train_s"] for r in recs) for recs in runs]
  n_rounds = len(runs[0])
  return {"side": "authors", "cell": cell, "seeds": procs, "procs": procs, "rounds": n_rounds,
          "samples_per_s_per_seed": statistics.median(speeds),
          "process_s_per_seed_run": total / procs, "first_round_s": statistics.median(first),
          "cpu_s_per_seed_round": cpu / (procs * n_rounds),
          "seed_runs_per_hour": 3600 * procs / total,
          "round_s": [r["train_s"] for r in runs[0]]}


def jsfl_run(cell: str, model: str, rounds: int, seeds: int, jsfl: str,
             cache: str = "off") -> dict:
  """``cache``: ``off`` (every program compiled in the timed run) or
  ``warm`` (a one-round run of the same cell and seeds fills a fresh
  compilation cache first, untimed: what every later run of a config finds)."""
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, JSFL_COMPILE_CACHE="off" if cache == "off"
               else os.path.join(tmp, "cache"))

    def cmd(out, n):
      return [jsfl, "run", os.path.join(ROOT, CONFIGS[model]), *CELLS[cell],
              f"run.seeds={seeds}", f"run.rounds={n}", "run.checkpoint_every=0",
              f"run.dir={out}", "--quiet"]
    if cache == "warm":
      subprocess.run(cmd(os.path.join(tmp, "warmup"), 1), cwd=ROOT, env=env, check=True,
                     stdout=subprocess.DEVNULL)
    out = os.path.join(tmp, "run")
    total, (first,), cpu = timed([(cmd(out, rounds), os.path.join(out, "metrics.jsonl"),
                                   {"cwd": ROOT, "env": env})])
    recs = read_jsonl(os.path.join(out, "metrics.jsonl"))
  walls = {r["round"]: r["wall_s"] for r in recs}
  later = [r for r in recs if r["round"] > 1]
  train = sum(w for k, w in walls.items() if k > 1)
  return {"side": "jsfl", "cell": cell, "seeds": seeds, "rounds": rounds, "cache": cache,
          "samples_per_s_per_seed": sum(r["samples"] for r in later) / train / seeds,
          "process_s_per_seed_run": total / seeds, "first_round_s": first,
          "first_round_wall_s": walls[1], "cpu_s_per_seed_round": cpu / (seeds * rounds),
          "seed_runs_per_hour": 3600 * seeds / total,
          "round_s": [walls[k] for k in sorted(walls)]}


MODELS = {"small_cnn": ("small_cnn", {}), "mobilenet": ("mobilenet_v1", {"width": 0.5}),
          "multisfl": ("small_cnn", {"norm": "batch"})}


def train_flops_per_sample(model: str, batch: int = 64) -> float:
  """XLA's count of one training step's FLOPs (forward and backward of the
  whole model on a batch of Fashion-MNIST's shape) per sample: the work
  both sides do per training sample, split or not."""
  import jax
  import jax.numpy as jnp
  import optax

  from jsfl.models import get_model
  name, opts = MODELS[model]
  m = get_model(name, (28, 28, 1), 10, **opts)
  params, stats = m.init(jax.random.key(0))
  x, y = jnp.zeros((batch, 28, 28, 1)), jnp.zeros((batch,), jnp.int32)

  def loss(p):
    out, _ = m.apply(p, stats, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()
  cost = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost["flops"]) / batch


def matmul_flops_per_s(n: int = 2048, repeats: int = 10) -> float:
  """The best of ``repeats`` f32 n x n matmuls through XLA on every core: the
  machine's practical peak that achieved FLOP/s are set against."""
  import jax
  import jax.numpy as jnp
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best


def cpu_model() -> str:
  """The CPU's name and family / model numbers (a VM's host can change
  between runs while its hostname and kernel stay)."""
  fields = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
  except OSError:
    return platform.processor()
  return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
          f"model {fields.get('model', '?')})")


def machine() -> dict:
  return {"host": socket.gethostname(), "platform": platform.platform(),
          "cpu": cpu_model(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}


def _default_jsfl() -> str:
  # the venv's jsfl when this script runs with the venv's python but the venv
  # is not activated; checked before the authors' side spends its minutes
  beside = os.path.join(os.path.dirname(sys.executable), "jsfl")
  return beside if os.access(beside, os.X_OK) else (shutil.which("jsfl") or "jsfl")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", choices=sorted(CONFIGS), default="small_cnn")
  ap.add_argument("--cells", nargs="+", choices=sorted(CELLS),
                  default=["sfl_cyclic", "hydra_cyclic"])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--seeds", type=int, default=1, help="jsfl's slots per program")
  ap.add_argument("--procs", type=int, default=1,
                  help="the authors' one-thread processes side by side (one seed each)")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--cache", choices=("off", "warm"), default="off",
                  help="jsfl's compilation cache: off, or warm (filled by an untimed "
                       "one-round run of the same cell first)")
  ap.add_argument("--clone", default=os.environ.get("CLONE"),
                  help="the authors' adapted clone (default: /work/authors/Hydra, or "
                       "/work/authors/MultiSFL for --model multisfl)")
  ap.add_argument("--py", default=os.environ.get("PY", "/work/authors/venv/bin/python"))
  ap.add_argument("--jsfl", default=_default_jsfl(),
                  help="the jsfl command (default: the one beside this Python, else on PATH)")
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = ap.parse_args()
  args.clone = args.clone or CLONES[args.model]
  if shutil.which(args.jsfl) is None:
    ap.error(f"--jsfl {args.jsfl}: not an executable; allowed: a jsfl command "
             "(install jsfl into this Python's environment, or pass its path)")
  if args.model == "multisfl" and args.cells == ap.get_default("cells"):
    args.cells = ["multisfl"]
  bad = [c for c in args.cells if c not in MODEL_CELLS[args.model]]
  if bad:
    ap.error(f"--cells {' '.join(bad)} for --model {args.model}; allowed: "
             f"{', '.join(MODEL_CELLS[args.model])}")

  flops = train_flops_per_sample(args.model)
  peak = matmul_flops_per_s()
  print(f"# {flops / 1e6:.2f} MFLOP per training sample (XLA); matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s", flush=True)
  rows = []
  for rep in range(args.repeats):
    for cell in args.cells:
      for side in ("authors", "jsfl"):
        row = (authors_run(cell, args.model, args.rounds, args.clone, args.py, args.procs)
               if side == "authors" else
               jsfl_run(cell, args.model, args.rounds, args.seeds, args.jsfl, args.cache))
        row["repeat"] = rep
        # all the machine's training: every process or slot side by side
        row["samples_per_s"] = row["samples_per_s_per_seed"] * row["seeds"]
        # every process or slot of the row trains at samples_per_s_per_seed
        row["gflop_per_s"] = row["samples_per_s_per_seed"] * row["seeds"] * flops / 1e9
        row["of_peak"] = row["gflop_per_s"] * 1e9 / peak
        rows.append(row)
        print(f"{cell:<14} {side:<8} {row['samples_per_s_per_seed']:8.0f} samples/s/seed  "
              f"{row['process_s_per_seed_run']:6.1f} s/seed-run  "
              f"{row['cpu_s_per_seed_round']:6.2f} CPU-s/seed-round  "
              f"{row['first_round_s']:5.1f} s to round 1  "
              f"{row['gflop_per_s']:5.1f} GFLOP/s ({row['of_peak']:.0%} of peak)", flush=True)

  print(f"\n| cell | side | training samples/s (all seeds) | s per seed-run "
        f"({args.rounds} rounds) | CPU-s per seed-round | s to round 1 |")
  print("| --- | --- | --- | --- | --- | --- |")
  summary = []
  for cell in args.cells:
    med = {}
    for side in ("authors", "jsfl"):
      got = [r for r in rows if r["cell"] == cell and r["side"] == side]
      med[side] = tuple(statistics.median(r[k] for r in got) for k in (
          "samples_per_s", "process_s_per_seed_run", "cpu_s_per_seed_round",
          "first_round_s"))
      print(f"| {cell} | {side} | {med[side][0]:,.0f} | {med[side][1]:.1f} | "
            f"{med[side][2]:.2f} | {med[side][3]:.1f} |")
    summary.append({"cell": cell, "authors": med["authors"], "jsfl": med["jsfl"],
                    "samples_ratio": med["jsfl"][0] / med["authors"][0],
                    "seed_runs_per_hour_ratio": med["authors"][1] / med["jsfl"][1],
                    "cpu_ratio": med["authors"][2] / med["jsfl"][2]})
    print(f"| {cell} | jsfl / authors | {summary[-1]['samples_ratio']:.2f}x | "
          f"{summary[-1]['seed_runs_per_hour_ratio']:.2f}x seed-runs per hour | "
          f"{summary[-1]['cpu_ratio']:.2f}x (their CPU-s / jsfl's) | |")
  os.makedirs(args.out, exist_ok=True)
  stamp = time.strftime("%Y%m%d-%H%M%S")
  path = os.path.join(args.out,
                      f"hydra_vs_authors-{args.model}-{socket.gethostname()}-{stamp}.json")
  with open(path, "w") as f:
    json.dump({"machine": machine(), "args": vars(args), "train_flops_per_sample": flops,
               "matmul_peak_flops_per_s": peak, "rows": rows, "summary": summary},
              f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
