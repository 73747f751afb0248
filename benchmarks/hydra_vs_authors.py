"""Speed of SFL and Hydra rounds, jsfl against the Hydra authors' code.

The cells are those of the cross-check (``experiments/hydra/authors.toml``):
Fashion-MNIST, the 6,000-image subset, 80%-DL, 10 clients, batch 64, small
CNN cut 2 (``--model mobilenet``: MobileNetV1 width 0.5, cut 4).  Per cell
and repeat the two sides run one after the other (authors, jsfl, authors,
jsfl, ...), so a load that changes hits both alike:

* the authors' code through ``experiments/hydra/authors_code/run.sh`` (the
  adapted clone, one torch thread, one seed): its round log gives training
  samples over training seconds (``train_s``: round start to evaluation);
* jsfl through ``jsfl run`` with the same cell (``--seeds`` seeds as the
  slots of one program, the default execution): samples over ``wall_s`` of
  rounds 2.. (round 1 compiles; evaluation is outside ``wall_s``).

Reported per side: training samples per second per seed, and the whole
process's wall time per seed-run (start-up, data, compilation, every
round's training and evaluation: what a user waits for), from which
seed-runs per hour on one process follow.

    python benchmarks/hydra_vs_authors.py --cells sfl_cyclic hydra_cyclic --rounds 5
    python benchmarks/hydra_vs_authors.py --model mobilenet --rounds 3

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
CONFIGS = {"small_cnn": "experiments/hydra/fmnist.toml",
           "mobilenet": "experiments/hydra/fmnist_mobilenet.toml"}
# run.sh's cell -> the jsfl overrides of the same cell (authors.toml)
CELLS = {
    "sfl_cyclic": ["method.name=sfl", "method.order=cyclic"],
    "sfl_random": ["method.name=sfl", "method.order=random"],
    "hydra_cyclic": ["method.name=hydra", "method.order=cyclic"],
    "hydra_random": ["method.name=hydra", "method.order=random"],
}


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def authors_run(cell: str, model: str, rounds: int, clone: str, py: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, MODEL=model, ROUNDS=str(rounds), SEEDS="0", CELLS=cell,
               CLONE=clone, PY=py, THREADS="1")
    t0 = time.perf_counter()
    subprocess.run(["bash", RECIPE, tmp], check=True, env=env, stdout=subprocess.DEVNULL)
    total = time.perf_counter() - t0
    recs = read_jsonl(os.path.join(tmp, model, f"{cell}_seed0.jsonl"))
  train = sum(r["train_s"] for r in recs)
  return {"side": "authors", "cell": cell, "seeds": 1, "rounds": len(recs),
          "samples_per_s_per_seed": sum(r["samples"] for r in recs) / train,
          "process_s_per_seed_run": total, "round_s": [r["train_s"] for r in recs]}


def jsfl_run(cell: str, model: str, rounds: int, seeds: int, jsfl: str) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "run")
    cmd = [jsfl, "run", os.path.join(ROOT, CONFIGS[model]), *CELLS[cell],
           f"run.seeds={seeds}", f"run.rounds={rounds}", "run.checkpoint_every=0",
           f"run.dir={out}", "--quiet"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    total = time.perf_counter() - t0
    recs = read_jsonl(os.path.join(out, "metrics.jsonl"))
  walls = {r["round"]: r["wall_s"] for r in recs}
  timed = [r for r in recs if r["round"] > 1]
  train = sum(w for k, w in walls.items() if k > 1)
  return {"side": "jsfl", "cell": cell, "seeds": seeds, "rounds": rounds,
          "samples_per_s_per_seed": sum(r["samples"] for r in timed) / train / seeds,
          "process_s_per_seed_run": total / seeds, "first_round_s": walls[1],
          "round_s": [walls[k] for k in sorted(walls)]}


def machine() -> dict:
  return {"host": socket.gethostname(), "platform": platform.platform(),
          "cpus": os.cpu_count(), "python": sys.version.split()[0]}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", choices=sorted(CONFIGS), default="small_cnn")
  ap.add_argument("--cells", nargs="+", choices=sorted(CELLS),
                  default=["sfl_cyclic", "hydra_cyclic"])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--seeds", type=int, default=1, help="jsfl's slots per program")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--clone", default=os.environ.get("CLONE", "/work/authors/Hydra"))
  ap.add_argument("--py", default=os.environ.get("PY", "/work/authors/venv/bin/python"))
  ap.add_argument("--jsfl", default=shutil.which("jsfl") or "jsfl")
  ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = ap.parse_args()

  rows = []
  for rep in range(args.repeats):
    for cell in args.cells:
      for side in ("authors", "jsfl"):
        row = (authors_run(cell, args.model, args.rounds, args.clone, args.py)
               if side == "authors" else
               jsfl_run(cell, args.model, args.rounds, args.seeds, args.jsfl))
        row["repeat"] = rep
        rows.append(row)
        print(f"{cell:<14} {side:<8} {row['samples_per_s_per_seed']:8.0f} samples/s/seed  "
              f"{row['process_s_per_seed_run']:6.1f} s/seed-run", flush=True)

  print(f"\n| cell | side | samples/s per seed | s per seed-run ({args.rounds} rounds) |")
  print("| --- | --- | --- | --- |")
  summary = []
  for cell in args.cells:
    med = {}
    for side in ("authors", "jsfl"):
      got = [r for r in rows if r["cell"] == cell and r["side"] == side]
      med[side] = (statistics.median(r["samples_per_s_per_seed"] for r in got),
                   statistics.median(r["process_s_per_seed_run"] for r in got))
      print(f"| {cell} | {side} | {med[side][0]:,.0f} | {med[side][1]:.1f} |")
    summary.append({"cell": cell, "authors": med["authors"], "jsfl": med["jsfl"],
                    "samples_ratio": med["jsfl"][0] / med["authors"][0],
                    "seed_runs_per_hour_ratio": med["authors"][1] / med["jsfl"][1]})
    print(f"| {cell} | jsfl / authors | {summary[-1]['samples_ratio']:.2f}x | "
          f"{summary[-1]['seed_runs_per_hour_ratio']:.2f}x seed-runs per hour |")
  os.makedirs(args.out, exist_ok=True)
  stamp = time.strftime("%Y%m%d-%H%M%S")
  path = os.path.join(args.out,
                      f"hydra_vs_authors-{args.model}-{socket.gethostname()}-{stamp}.json")
  with open(path, "w") as f:
    json.dump({"machine": machine(), "args": vars(args), "rows": rows, "summary": summary},
              f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
