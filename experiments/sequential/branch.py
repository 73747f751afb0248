"""Branch a run at one of its checkpoints with other option values, and read
the branch against the runs it left.

Usage:
  python experiments/sequential/branch.py make RUN_DIR OUT_DIR --at R \
      [--rounds N] key=value ...
  jsfl run --resume OUT_DIR
  python experiments/sequential/branch.py compare BRANCH RUN [RUN ...] [--from R]

``make`` copies RUN_DIR's checkpoint of round R, its partition and its
records up to R into OUT_DIR, with config.json's ``section.key`` values
replaced (only values that leave the state's structure as it is: a
checkpoint of another structure is refused on resume) and ``run.rounds``
set to N (default R + 30). Resuming trains rounds R+1..N from the
checkpoint, the same clients and batches as the run (the keys are a
function of seed and round), under the new values. Used in
experiments/sequential/README.md to switch SFedKD's distillation off at
round 332 of the Table-1 run (``method.alpha_t=0.0 method.beta_t=0.0``: FedSeq's
training from SFedKD's state).

``compare`` prints, over the rounds after ``--from`` that BRANCH and every RUN
evaluated (``metrics.jsonl`` or ``.gz``, a run directory or the file), the
median accuracy over seeds per round and, per seed, BRANCH's mean accuracy
minus each RUN's (same seed, same partition and clients), with how many
seeds are behind: a paired reading of the branch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import uuid

from jsfl import rundir


def _fail(line: str) -> None:
  print(f"branch.py: {line}", file=sys.stderr)
  sys.exit(2)


def _records(path: str) -> dict[tuple[int, int], float]:
  if os.path.isdir(path):
    plain = os.path.join(path, "metrics.jsonl")
    path = plain if os.path.exists(plain) else plain + ".gz"
  opener = gzip.open if path.endswith(".gz") else open
  out = {}
  with opener(path, "rt") as f:
    for line in f:
      r = json.loads(line)
      if r.get("accuracy") is not None:
        out[(r["round"], r["seed"])] = r["accuracy"]
  return out


def _value(text: str):
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def make(args) -> None:
  src, dst, at = args.run_dir, args.out_dir, args.at
  ckpt = os.path.join(src, "checkpoints", str(at))
  if not os.path.isdir(ckpt):
    have = sorted(os.listdir(os.path.join(src, "checkpoints")), key=int)
    _fail(f"no checkpoint of round {at} in {src}; allowed: one of {have}")
  if os.path.exists(dst):
    _fail(f"{dst} exists; allowed: a new directory")
  with open(os.path.join(src, "config.json")) as f:
    stored = json.load(f)
  cfg = stored["config"]
  for item in args.overrides:
    key, _, text = item.partition("=")
    section, _, field = key.partition(".")
    if field not in cfg.get(section, {}):
      _fail(f"{key!r} is not a key of the run's config; allowed: section.key")
    cfg[section][field] = _value(text)
  cfg["run"]["rounds"] = args.rounds or at + 30
  cfg["run"]["dir"] = dst
  stored["run_id"] = uuid.uuid4().hex  # another run to its trackers than the one it left
  os.makedirs(os.path.join(dst, "checkpoints"))
  shutil.copytree(ckpt, os.path.join(dst, "checkpoints", str(at)))
  shutil.copy(os.path.join(src, "partition.json"), dst)
  with open(os.path.join(src, "metrics.jsonl")) as f, \
      open(os.path.join(dst, "metrics.jsonl"), "w") as g:
    g.writelines(line for line in f if json.loads(line)["round"] <= at)
  sessions = os.path.join(src, rundir.SESSIONS)
  if os.path.isfile(sessions):  # which code wrote the rounds it keeps
    with open(os.path.join(dst, rundir.SESSIONS), "w") as f:
      f.writelines(json.dumps(x) + "\n" for x in rundir.read_jsonl(sessions)
                   if x["from_round"] <= at)
  rundir.write_json_atomic(os.path.join(dst, "config.json"), stored)
  print(f"{dst}: round {at} of {src}; now: jsfl run --resume {dst}")


def compare(args) -> None:
  branch = _records(args.branch)
  runs = {p: _records(p) for p in args.runs}
  seeds = sorted({s for _, s in branch})
  rounds = sorted({r for r, _ in branch if r > args.start
                   and all((r, s) in d for d in runs.values() for s in seeds)})
  if not rounds:
    _fail("no round after --from that the branch and every run evaluated")
  names = ["branch"] + [os.path.basename(os.path.normpath(p)) for p in args.runs]
  print("round | " + " | ".join(names))
  for r in rounds:
    meds = [statistics.median(d[(r, s)] for s in seeds) for d in [branch, *runs.values()]]
    print(f"{r} | " + " | ".join(f"{m:.2f}" for m in meds))
  for name, d in zip(names[1:], runs.values(), strict=True):
    diff = [statistics.mean(branch[(r, s)] - d[(r, s)] for r in rounds) for s in seeds]
    print(f"branch - {name}, rounds {rounds[0]}-{rounds[-1]}, per seed: "
          + " ".join(f"{x:+.1f}" for x in diff)
          + f"; behind in {sum(x < 0 for x in diff)} of {len(diff)}, median "
          f"{statistics.median(diff):+.2f}")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  m = sub.add_parser("make")
  m.add_argument("run_dir")
  m.add_argument("out_dir")
  m.add_argument("--at", type=int, required=True, help="the checkpoint's round")
  m.add_argument("--rounds", type=int, default=0, help="run.rounds of the branch")
  m.add_argument("overrides", nargs="*", metavar="section.key=value")
  c = sub.add_parser("compare")
  c.add_argument("branch")
  c.add_argument("runs", nargs="+")
  c.add_argument("--from", dest="start", type=int, default=0)
  args, extra = p.parse_known_args(argv)  # overrides may follow --at
  if extra and (args.command != "make" or any("=" not in e for e in extra)):
    p.error(f"unrecognized arguments: {' '.join(extra)}")
  if extra:
    args.overrides += extra
  (make if args.command == "make" else compare)(args)


if __name__ == "__main__":
  main()
