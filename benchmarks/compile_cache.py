"""Seconds from process start to the first finished round, with and without
the persistent compilation cache (``exec.compile_cache``).

For each config, alternating, in fresh processes:
  cold     a new run with an empty cache directory;
  warm     a new run of the same config, the cache filled by the cold start;
  resume   ``jsfl run --resume`` of a run stopped by SIGTERM, cache warm;
  resume0  the same resume with the cache off (what every resume cost before).
The clock starts before the interpreter does (``python -m jsfl``, imports
included) and stops when the first new record reaches ``metrics.jsonl``.

  python benchmarks/compile_cache.py                     # small CNN and MobileNetV1 x0.5
  python benchmarks/compile_cache.py --configs hydra_cnn --repeats 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {
    # the Hydra cross-check cell: small CNN, 10 clients, 6k subset, 5 seeds
    "hydra_cnn": ["experiments/hydra/fmnist.toml", "method.name=hydra", "run.seeds=5"],
    "hydra_mobilenet": ["experiments/hydra/fmnist_mobilenet.toml", "method.name=hydra",
                        "run.seeds=3"],
}


def first_record_s(cmd, run_dir, env, skip_lines=0, timeout=900.0):
  """Seconds until ``run_dir/metrics.jsonl`` has more than ``skip_lines``
  lines; the process is then left to finish."""
  path = os.path.join(run_dir, "metrics.jsonl")
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  seen = None
  while time.perf_counter() - t0 < timeout:
    try:
      with open(path) as f:
        if sum(1 for _ in f) > skip_lines:
          seen = time.perf_counter() - t0
          break
    except FileNotFoundError:
      pass
    if proc.poll() is not None:
      break
    time.sleep(0.05)
  _, err = proc.communicate()
  if proc.returncode != 0 or seen is None:
    raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
  return seen


def stop_after_first_record(cmd, run_dir, env, timeout=900.0):
  """Runs ``cmd`` and sends SIGTERM once its first record is written."""
  path = os.path.join(run_dir, "metrics.jsonl")
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < timeout and proc.poll() is None:
    if os.path.exists(path) and os.path.getsize(path) > 0:
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.05)
  if proc.wait() != 128 + signal.SIGTERM:
    raise SystemExit(f"{' '.join(cmd)}: expected a stop by SIGTERM, got {proc.returncode}")


def measure(name, args, scratch, repeat):
  py = [sys.executable, "-m", "jsfl", "run", *args, "--quiet", "run.eval_every=1"]
  cache = os.path.join(scratch, f"cache-{name}-{repeat}")
  env = {**os.environ, "JSFL_COMPILE_CACHE": cache}
  d = lambda tag: os.path.join(scratch, f"{name}-{tag}-{repeat}")
  out = {"cold": first_record_s(py + ["run.rounds=1", f"run.dir={d('cold')}"], d("cold"), env),
         "warm": first_record_s(py + ["run.rounds=1", f"run.dir={d('warm')}"], d("warm"), env)}
  # a stopped run, as a user stops one: SIGTERM after its first record, so it
  # checkpoints after the round in flight and exits; then resumed twice
  stop_after_first_record(py + ["run.rounds=4", "run.checkpoint_every=1",
                                f"run.dir={d('stopped')}"], d("stopped"), env)
  shutil.copytree(d("stopped"), d("stopped0"))
  with open(os.path.join(d("stopped"), "metrics.jsonl")) as f:
    lines = sum(1 for _ in f)
  for tag, e in (("stopped", env), ("stopped0", {**env, "JSFL_COMPILE_CACHE": "off"})):
    out["resume" if tag == "stopped" else "resume0"] = first_record_s(
        [sys.executable, "-m", "jsfl", "run", "--resume", d(tag), "--quiet"], d(tag), e,
        skip_lines=lines)
  out["cache_mb"] = sum(os.path.getsize(os.path.join(cache, f))
                        for f in os.listdir(cache)) / 2**20
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  machine = _results.machine()
  print("#", machine)
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    for rep in range(args.repeats):
      for name in args.configs:
        r = measure(name, CONFIGS[name], scratch, rep)
        results.setdefault(name, []).append(r)
        print(f"{name} #{rep}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
  rows = {}
  print("| config | cold start (s) | warm start (s) | resume, cache (s) | resume, no cache (s)"
        " | cache (MiB) |")
  print("| --- | --- | --- | --- | --- | --- |")
  for name, rs in results.items():
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    rows[name] = {"median": med, "runs": rs, "args": CONFIGS[name]}
    print(f"| {name} | {med['cold']:.1f} | {med['warm']:.1f} | {med['resume']:.1f} | "
          f"{med['resume0']:.1f} | {med['cache_mb']:.1f} |")
  path = _results.write_json(
      _results.path(args.out, "compile_cache", machine["backend"]),
      {"benchmark": "compile_cache", "machine": machine, "repeats": args.repeats,
       "what": "seconds from process start to the first new metrics.jsonl record",
       "configs": rows})
  print("wrote", path)


if __name__ == "__main__":
  main()
