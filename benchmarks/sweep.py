"""A sweep grid run as slots of one program against one program per cell.

The grid (defaults): SFL, small CNN, Fashion-MNIST-shaped synthetic data
(28x28x1, 10 classes, ``--train-size`` samples), 10 clients under Dirichlet
label skew, 3 learning rates x 3 Dirichlet alphas x 5 seeds = 45 runs
(9 cells of 5 seeds), ``--rounds`` rounds.  Two modes, each one
``jsfl sweep`` in its own subprocess, timed end to end (interpreter and jax
start, data, partitions, compilation, training, evaluation, files: what a
user waits for):

* ``per_cell``: ``jsfl sweep --per-cell``, one program per cell (its seeds
  its slots), how sweeps ran before slots: 9 compilations;
* ``slots``: ``jsfl sweep``, the 9 cells as the 45 slots of one program.

Reported per mode: wall seconds, runs per hour, training samples per second
(every run's samples over the wall time); their ratios; and the largest
difference between the two modes' accuracies (the same runs, so float noise
only).  With ``--repeats`` > 1 the modes alternate (per_cell, slots,
slots, per_cell, ...) and medians are reported.

Writes ``benchmarks/results/sweep-<backend>-<host>-<time>.json`` and a PNG.

Usage::

  python benchmarks/sweep.py                           # the 45-run grid, 3 rounds
  python benchmarks/sweep.py --train-size 60000 --rounds 5   # a GPU-sized one
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sweep_file(args, out_dir: str) -> str:
  text = f"""[sweep]
name = "grid"
out_dir = "{out_dir}"

[base]
"dataset.name" = "synthetic"
"dataset.input_shape" = [28, 28, 1]
"dataset.num_classes" = 10
"dataset.train_size" = {args.train_size}
"dataset.test_size" = {args.test_size}
"model.name" = "small_cnn"
"method.name" = "{args.method}"
"method.batch_size" = {args.batch}
"partition.name" = "dirichlet"
"partition.num_clients" = {args.clients}
"run.rounds" = {args.rounds}
"run.seeds" = {args.seeds}
"run.eval_every" = {args.rounds}
"exec.progress" = false
# every timing compiles afresh: a warm persistent cache (~/.cache/jsfl/xla)
# would serve a rerun's or a repeat's programs
"exec.compile_cache" = "off"

[grid]
"optim.lr" = [{", ".join(map(str, args.lrs))}]
"partition.alpha" = [{", ".join(map(str, args.alphas))}]
"""
  path = os.path.join(out_dir, "grid.toml")
  with open(path, "w") as f:
    f.write(text)
  return path


def records(root: str) -> dict:
  """``(cell, seed, round) -> record`` of every cell directory under ``root``."""
  out = {}
  for cell in sorted(os.listdir(root)):
    path = os.path.join(root, cell, "metrics.jsonl")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        out[(cell, r["seed"], r["round"])] = r
  return out


def run_mode(args, mode: str) -> dict:
  with tempfile.TemporaryDirectory(prefix=f"jsfl-sweep-{mode}-") as tmp:
    path = sweep_file(args, tmp)
    cmd = [sys.executable, "-m", "jsfl", "sweep", path, "--quiet"]
    if mode == "per_cell":
      cmd.append("--per-cell")
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
      raise SystemExit(f"{mode}: jsfl sweep failed ({proc.returncode}):\n{proc.stdout}\n"
                       f"{proc.stderr}")
    recs = records(os.path.join(tmp, "grid"))
  programs = sum(line.startswith("[") for line in proc.stdout.splitlines())
  runs = len({(c, s) for c, s, _ in recs})
  # every round's training samples of every run (records of unevaluated
  # rounds are not written, so the evaluated ones stand for their span)
  samples = sum(r["samples"] for r in recs.values()) * args.rounds // max(
      len({k[2] for k in recs}), 1)
  return {"mode": mode, "wall_s": wall, "runs": runs, "programs": programs,
          "runs_per_hour": runs / wall * 3600, "samples_per_s": samples / wall,
          "accuracy": {f"{c}|{s}|{r}": v["accuracy"] for (c, s, r), v in recs.items()}}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--method", default="sfl")
  ap.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.03, 0.1])
  ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.5, 1.0])
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--clients", type=int, default=10)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--train-size", type=int, default=6000)
  ap.add_argument("--test-size", type=int, default=1000)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()

  import jax  # the machine, as the subprocesses will see it
  backend = jax.default_backend()
  device = f"{jax.devices()[0].platform}:{getattr(jax.devices()[0], 'device_kind', '?')}"
  order = []
  for k in range(args.repeats):
    order += ["per_cell", "slots"] if k % 2 == 0 else ["slots", "per_cell"]
  results = {"per_cell": [], "slots": []}
  for mode in order:
    res = run_mode(args, mode)
    results[mode].append(res)
    print(f"{mode:9s} {res['programs']} program{'s' * (res['programs'] != 1)}, {res['runs']} "
          f"runs: {res['wall_s']:7.1f} s, "
          f"{res['runs_per_hour']:8.1f} runs/h, {res['samples_per_s']:9.0f} samples/s",
          flush=True)
  med = {m: {k: statistics.median(r[k] for r in rs)
             for k in ("wall_s", "runs_per_hour", "samples_per_s")}
         for m, rs in results.items()}
  a, b = results["per_cell"][0]["accuracy"], results["slots"][0]["accuracy"]
  diff = max(abs(a[k] - b[k]) for k in a) if set(a) == set(b) else None
  ratio = med["slots"]["runs_per_hour"] / med["per_cell"]["runs_per_hour"]
  print(f"slots / per_cell: {ratio:.2f}x runs/hour; largest accuracy difference "
        f"{diff if diff is None else f'{diff:.4f}'} points")
  host = _results.host(short=True)
  out = {"benchmark": "sweep", "grid": {k: v for k, v in vars(args).items() if k != "out"},
         "runs": len(args.lrs) * len(args.alphas) * args.seeds,
         "machine": {"host": host, "backend": backend, "device": device,
                     "devices": jax.device_count(), "cpus": os.cpu_count(),
                     "platform": platform.platform(), "python": sys.version.split()[0],
                     "jax": jax.__version__},
         "median": med, "ratio_runs_per_hour": ratio, "max_accuracy_difference": diff,
         "repeats": {m: [{k: v for k, v in r.items() if k != "accuracy"} for r in rs]
                     for m, rs in results.items()},
         "command": " ".join(["python", "benchmarks/sweep.py", *sys.argv[1:]])}
  base = _results.path(args.out, "sweep", backend, host, ext="")
  _results.write_json(base + ".json", out)
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    modes = ["per_cell", "slots"]
    labels = [f"per cell\n({results['per_cell'][0]['programs']} programs)",
              f"slots\n({results['slots'][0]['programs']} program)"]
    axes[0].bar(labels, [med[m]["wall_s"] for m in modes], color=["#999", "#1f77b4"])
    axes[0].set_ylabel("wall time, end to end (s)")
    axes[1].bar(labels, [med[m]["runs_per_hour"] for m in modes], color=["#999", "#1f77b4"])
    axes[1].set_ylabel("runs / hour")
    fig.suptitle(f"{out['runs']} runs ({args.method}, {len(args.lrs)} lr x {len(args.alphas)} "
                 f"alpha x {args.seeds} seeds, {args.rounds} rounds) on {device}: "
                 f"{ratio:.2f}x", fontsize=9)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=120)
  except ImportError:
    pass
  print(f"wrote {base}.json")


if __name__ == "__main__":
  main()
