"""A paper sweep's programs at the paper's scale, as far as one accelerator
lease gets them.

SFedKD Table 1's Fashion-MNIST rows are 1000 rounds of 10 seeds a cell:
about 18-20 hours a cell on one core of the 2-core CPU
(``experiments/sequential/README.md``).  A sequential round is some 500-1000
LeNet-5 batch steps one after another, so on a GPU a round costs its kernel
launches more than its arithmetic, and how many rounds a lease holds is
what this measures.  It runs the chosen programs of a sweep file (``jsfl
sweep FILE --shard i/n``) one after another until ``--deadline``, stops the
one running then with SIGTERM (jsfl ends it after the current round, with a
checkpoint), and reports per program: rounds reached per cell, seconds a
round after the first (the records' ``wall_s``: the round program alone),
training samples per second, the first round (compilation included) and the
process's seconds.  The cells' records (``config.json``, ``summary.json``,
``metrics.jsonl.gz``, ``partition.json.gz``, ``sessions.jsonl`` and method artifacts, no
checkpoints) go into one tar beside the JSON, laid out as
``<sweep name>/<cell>/`` to unpack under ``experiments/<paper>/results/``,
where ``jsfl sweep FILE --out-dir ... --collect`` reads them.

    python benchmarks/paper_run.py experiments/sequential/paper/table1_fashion_mnist.toml \\
        --per-cell --shards 12/14 8/14 --deadline 480 --data .gpu_carry/data
    python benchmarks/paper_run.py experiments/sequential/paper/table1_fashion_mnist.toml --smoke

``--data DIR`` is ``$JSFL_DATA`` for the runs (the full Fashion-MNIST files
in ``DIR/fashion_mnist/``).  ``--smoke`` runs the same programs of a copy of
the sweep file at toy sizes on synthetic 28x28 data (any backend).  Writes
``results/paper_run-<sweep>-<backend>-<host>-<time>.json`` and ``.tar``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib

import _results  # benchmarks/ is not a package: a sibling module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # jsfl from this checkout, installed or not

from jsfl import reading  # noqa: E402
from jsfl.sweep import (  # noqa: E402
  SweepError,
  finished,
  load_sweep,
  parse_shard,
  plan,
  resolve,
  shard,
  toml_value,
)
from jsfl.sweep.format import flatten  # noqa: E402
from jsfl.sweep.plan import read_json  # noqa: E402

# What a stopped program gets to finish its round and write its checkpoint.
STOP_GRACE_S = 45
# A program is not started with less time than this left.
MIN_START_S = 60
# Toy sizes of --smoke: every cell's setting shrunk, the grid kept.
SMOKE_BASE = {"dataset.name": "synthetic", "dataset.input_shape": [28, 28, 1],
              "dataset.num_classes": 10, "dataset.train_size": 600, "dataset.test_size": 100,
              "partition.num_clients": 10, "method.clients_per_round": 5,
              "method.local_epochs": 1, "run.rounds": 3, "run.seeds": 2, "run.eval_every": 1,
              "run.checkpoint_every": 1}
# A cell's files that the tar leaves out: its state and its lock.
LEFT_OUT = ("checkpoints", ".lock")


def toml_item(v) -> str:
  """A parsed TOML value as TOML text; a table inline, so a copy parses to
  the same structure and key order."""
  if isinstance(v, dict):
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_item(x)}" for k, x in v.items()) + "}"
  if isinstance(v, list):
    return "[" + ", ".join(toml_item(x) for x in v) + "]"
  return toml_value(v)


def smoke_sweep(path: str, into: str) -> str:
  """A copy of the sweep file at :data:`SMOKE_BASE`'s sizes, written into
  ``into``; the same grid and cells, so the same cell names and programs."""
  with open(path, "rb") as src:
    raw = tomllib.load(src)
  head = dict(raw.get("sweep", {}))
  here = os.path.dirname(os.path.abspath(path))
  for k in ("base", "reference"):  # paths relative to the original file
    if k in head:
      head[k] = os.path.join(here, head[k])
  # [base] flat (section.key) so the toy sizes replace the file's values;
  # [grid] and [[cells]] as parsed, which keeps the cells and their order
  base = {**dict(flatten(raw.get("base", {}), "[base]", path)), **SMOKE_BASE}

  def table(header: str, t: dict) -> list[str]:
    return [header, *(f"{json.dumps(k)} = {toml_item(v)}" for k, v in t.items()), ""]
  lines = table("[sweep]", head) + table("[base]", base)
  if raw.get("grid"):
    lines += table("[grid]", raw["grid"])
  for cell in raw.get("cells", []):
    lines += table("[[cells]]", cell)
  out = os.path.join(into, os.path.basename(path))
  with open(out, "w") as dst:
    dst.write("\n".join(lines))
  return out


def shard_cells(path: str, work: str, spec: str, per_cell: bool) -> list[str]:
  """The cell directories of program(s) ``spec`` (``i/n``), as ``jsfl sweep
  --shard`` plans them; the planner imports no JAX."""
  sweep = load_sweep(path, out_dir=work)
  resolve(sweep)
  units = shard(plan(sweep, sweep.cells, per_cell=per_cell), *parse_shard(spec))
  return [c.dir for u in units for c in u.cells]


def run_program(cmd: list[str], env: dict, seconds: float) -> dict:
  """One ``jsfl sweep --shard`` process, SIGTERM after ``seconds``."""
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
  stopped = False
  try:
    proc.wait(timeout=max(seconds, 0))
  except subprocess.TimeoutExpired:
    stopped = True
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  return {"exit": proc.returncode, "stopped_at_deadline": stopped,
          "process_s": round(time.perf_counter() - t0, 2)}


def cell_figures(cell_dir: str) -> dict:
  """How far a cell got and at what rate, from its records."""
  run = reading.load_run(cell_dir)
  recs = run.records
  rounds = sorted({r["round"] for r in recs})
  wall = {r["round"]: r["wall_s"] for r in recs}
  samples: dict[int, float] = {}
  for r in recs:
    samples[r["round"]] = samples.get(r["round"], 0.0) + r.get("samples", 0)
  later = [k for k in rounds if k > 1] or rounds
  total = (run.config.get("run") or {}).get("rounds")
  acc = [r["accuracy"] for r in recs if rounds and r["round"] == rounds[-1]]
  summ = read_json(os.path.join(cell_dir, "summary.json"))
  summ = summ if isinstance(summ, dict) else {}
  return {
      "rounds_evaluated": rounds[-1] if rounds else 0, "rounds": total,
      "finished": isinstance(total, int) and finished(cell_dir, total),
      "first_round_s": wall.get(1),
      # wall_s is the round program's time; an evaluated round's is kept
      "round_s_median": round(statistics.median(wall[k] for k in later), 4) if later else None,
      "samples_per_s": (round(sum(samples[k] for k in later) / sum(wall[k] for k in later), 1)
                        if later else None),
      "median_accuracy_last": round(statistics.median(acc), 3) if acc else None,
      "seeds": len(acc), "diverged": summ.get("diverged", []),
      "problems": run.problems}


def pack(cell_dirs: list[str], name: str, tar_path: str) -> int:
  """The cells' records as ``name/<cell>/...``, the two large files gzipped
  (``gzip -9n``'s form: no name, time 0); returns the tar's bytes."""
  with tarfile.open(tar_path, "w") as tar:
    for d in cell_dirs:
      for f in sorted(os.listdir(d)):
        src = os.path.join(d, f)
        if f in LEFT_OUT or not os.path.isfile(src):
          continue
        arc = f"{name}/{os.path.basename(d)}/{f}"
        if f in ("metrics.jsonl", "partition.json"):
          buf = io.BytesIO()
          with open(src, "rb") as s, gzip.GzipFile(filename="", mode="wb", fileobj=buf,
                                                   compresslevel=9, mtime=0) as z:
            shutil.copyfileobj(s, z)
          info = tarfile.TarInfo(arc + ".gz")
          info.size, info.mtime = buf.tell(), int(os.path.getmtime(src))
          buf.seek(0)
          tar.addfile(info, buf)
        else:
          tar.add(src, arcname=arc, filter=anonymous)
  return os.path.getsize(tar_path)


def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
  info.uid = info.gid = 0
  info.uname = info.gname = ""
  return info


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("sweep", help="a sweep file (jsfl sweep FILE)")
  ap.add_argument("--shards", nargs="+", default=["12/14", "8/14"],
                  help="the programs to run, in order, as jsfl sweep --shard i/n")
  ap.add_argument("--per-cell", action="store_true", help="jsfl sweep --per-cell")
  ap.add_argument("--deadline", type=float, default=480,
                  help="seconds from the start: the running program is stopped then")
  ap.add_argument("--data", default=None, help="$JSFL_DATA for the runs")
  ap.add_argument("--work", default=None,
                  help="the sweep's --out-dir (default: a temporary one); a rerun resumes")
  ap.add_argument("--xla-flags", default="", help="added to XLA_FLAGS of the runs")
  ap.add_argument("--jsfl", default=f"{sys.executable} -m jsfl")
  ap.add_argument("--smoke", action="store_true", help="toy sizes, synthetic data")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  t0 = time.perf_counter()
  for s in args.shards:
    try:
      parse_shard(s)
    except SweepError as e:  # the sweep's own one line
      ap.error(f"--shards {s!r}: {e}")
  env = dict(os.environ)
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  if args.data:
    env["JSFL_DATA"] = os.path.abspath(args.data)
  if args.xla_flags:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
  with tempfile.TemporaryDirectory() as tmp:
    sweep = smoke_sweep(args.sweep, tmp) if args.smoke else os.path.abspath(args.sweep)
    work = os.path.abspath(args.work or os.path.join(tmp, "runs"))
    programs, cell_dirs, name = [], [], load_sweep(sweep).name
    here = os.path.relpath(sweep, ROOT) if sweep.startswith(ROOT + os.sep) else sweep
    for s in args.shards:
      cells = shard_cells(sweep, work, s, args.per_cell)
      cmd = [*args.jsfl.split(), "sweep", here, "--shard", s, "--out-dir",
             os.path.relpath(work, ROOT) if work.startswith(ROOT + os.sep) else work, "--quiet",
             *(["--per-cell"] if args.per_cell else [])]
      left = args.deadline - (time.perf_counter() - t0)
      row = {"shard": s, "command": " ".join(cmd), "started": left >= MIN_START_S}
      if row["started"]:
        print(" ".join(cmd), flush=True)
        row.update(run_program(cmd, env, left))
      else:
        print(f"paper_run: {s} not started ({left:.0f} s left)", flush=True)
      row["cells"] = {os.path.basename(c): cell_figures(c) for c in cells
                      if os.path.exists(reading.record_file(c, "metrics.jsonl"))}
      cell_dirs += [c for c in cells if os.path.basename(c) in row["cells"]]
      programs.append(row)
    res = {"machine": _results.machine(), "sweep": os.path.relpath(args.sweep, ROOT),
           "smoke": args.smoke, "deadline_s": args.deadline, "xla_flags": args.xla_flags,
           "programs": programs, "seconds": round(time.perf_counter() - t0, 1)}
    stem = _results.path(args.out, "paper_run", name, res["machine"]["backend"],
                         _results.host(), ext="")
    if cell_dirs:
      res["records"] = {"file": os.path.basename(stem) + ".tar",
                        "bytes": pack(cell_dirs, name, stem + ".tar")}
  _results.write_json(stem + ".json", res)
  for p in programs:
    for c, f in p.get("cells", {}).items():
      print(f"{c}: round {f['rounds_evaluated']} of {f['rounds']}"
            f"{' (finished)' if f['finished'] else ''}, {f['round_s_median']} s a round, "
            f"{f['samples_per_s']} samples/s, median accuracy {f['median_accuracy_last']}")
  print(f"wrote {stem}.json")


if __name__ == "__main__":
  main()
