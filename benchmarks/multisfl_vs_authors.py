"""Throughput of MultiSFL (and its baselines), jsfl against the authors' code.

The setting is ``experiments/multisfl/fmnist_authors.toml``: full Fashion-MNIST,
Dirichlet 0.1 (self-balancing, min size 10), 100 clients, 10 branches, batch
50, E = 5, jsfl's small CNN (cut 2).  For every ``exec.client_exec`` given,
jsfl trains one seed for ``--rounds`` rounds through ``jsfl run`` and the
figure is samples per second per seed over rounds 2.. (round 1 compiles):
the main clients' samples through part-1 over all local epochs (``samples``)
divided by the rounds' training time (``wall_s``, evaluation excluded).  The
authors' figure comes from their runs' round logs (the recipe in
``experiments/multisfl/authors_code/``): their ``samples`` over their
``wall_s`` (training and aggregation time, evaluation excluded), one torch
thread.  Replay (helper) samples are reported beside, not in, the figure.

    python benchmarks/multisfl_vs_authors.py --method multisfl splitfedv1 fedavg \\
        --exec vmap unroll map \\
        --authors-logs /work/authors/runs --rounds 4
    python benchmarks/multisfl_vs_authors.py --method multisfl --exec map vmap \
        --rounds 3 --set method.clients_per_round=50 method.local_epochs=1

Writes ``results/multisfl_vs_authors-<host>-<time>.json`` and prints a table.
Both sides are timed on the same 2-core machine with nothing else running.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIG = os.path.join(ROOT, "experiments/multisfl/fmnist_authors.toml")


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


AUTHORS = {"multisfl": "MultiSFL", "splitfedv1": "SFL", "fedavg": "FL"}


def jsfl_rate(method: str, client_exec: str, rounds: int, seed: int, jsfl: str,
              overrides: tuple[str, ...] = ()) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "run")
    cmd = [jsfl, "run", CONFIG, f"method.name={method}", "run.seeds=1", f"run.seed={seed}", f"run.rounds={rounds}",
           "run.checkpoint_every=0", *overrides, f"exec.client_exec={client_exec}",
           f"run.dir={out}", "--quiet"]
    subprocess.run(cmd, check=True)
    recs = read_jsonl(os.path.join(out, "metrics.jsonl"))
  timed = [r for r in recs if r["round"] > 1]
  wall = sum(r["wall_s"] for r in timed)
  return {"method": method, "client_exec": client_exec, "overrides": list(overrides), "rounds": [
              {k: r.get(k, 0) for k in ("round", "wall_s", "samples", "replay_samples")}
              for r in recs],
          "first_round_s": recs[0]["wall_s"],
          "samples_per_s": sum(r["samples"] for r in timed) / wall,
          "replay_samples_per_s": sum(r.get("replay_samples", 0) for r in timed) / wall}


def authors_rate(logs: str, method: str) -> list[dict]:
  rows = []
  for path in sorted(glob.glob(os.path.join(logs, f"{AUTHORS[method]}_seed*.jsonl"))):
    recs = read_jsonl(path)
    if not recs:
      continue
    wall = sum(r["train_s"] for r in recs)
    rows.append({"log": os.path.basename(path), "rounds": len(recs),
                 "samples_per_s": sum(r["samples"] for r in recs) / wall,
                 "replay_samples_per_s": sum(r.get("helper_samples", 0) for r in recs) / wall,
                 "mean_round_s": wall / len(recs)})
  return rows


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--method", nargs="+", default=["multisfl"], choices=sorted(AUTHORS))
  ap.add_argument("--exec", nargs="*", default=["vmap", "unroll"], dest="execs",
                  help="client_exec values to time (none: only read the authors' logs)")
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--authors-logs", default=None,
                  help="directory of the authors' MultiSFL_seed*.jsonl round logs")
  ap.add_argument("--authors-threads", type=int, default=1,
                  help="torch threads the authors' runs used (run.sh THREADS)")
  ap.add_argument("--set", nargs="*", default=[], dest="overrides", metavar="KEY=VALUE",
                  help="config overrides of the setting (method.clients_per_round=50: "
                       "the client loop past 32 clients a round)")
  ap.add_argument("--jsfl", default=os.path.join(os.path.dirname(sys.executable), "jsfl"))
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args(argv)
  res = {"machine": _results.machine(), "args": vars(args),
         "jsfl": [jsfl_rate(m, x, args.rounds, args.seed, args.jsfl, tuple(args.overrides))
                  for m in args.method for x in args.execs],
         "authors": ([dict(r, method=m, threads=args.authors_threads) for m in args.method
                      for r in authors_rate(args.authors_logs, m)]
                     if args.authors_logs else [])}
  print("| implementation | samples/s per seed | replay samples/s |")
  print("| --- | --- | --- |")
  for r in res["jsfl"]:
    print(f"| jsfl {r['method']}, client_exec={r['client_exec']} "
          f"{' '.join(r['overrides'])} | {r['samples_per_s']:,.0f} | "
          f"{r['replay_samples_per_s']:,.0f} |")
  for r in res["authors"]:
    print(f"| authors' code {r['method']} ({r['log']}, {r['rounds']} rounds, "
          f"{r['threads']} thread(s)) | "
          f"{r['samples_per_s']:,.0f} | {r['replay_samples_per_s']:,.0f} |")
  path = _results.write_json(_results.path(args.out, "multisfl_vs_authors", _results.host()), res)
  print(path)


if __name__ == "__main__":
  main()
