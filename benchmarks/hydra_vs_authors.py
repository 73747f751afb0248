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
    # on a GPU (benchmarks/gpu.sh vs_authors): their processes on cuda, the
    # clone and Fashion-MNIST from .gpu_carry (--write-data DIR writes the latter)
    python benchmarks/hydra_vs_authors.py --device cuda --procs 8 --threads 2 --seeds 8 \
      --clone .gpu_carry/Hydra --py python3 --data-dir .gpu_carry/fmnist --jsfl "python3 -m jsfl"

Writes ``results/hydra_vs_authors-<model>-<host>-<time>.json``, rewritten
after every row (``"finished": false`` until the last; ``--deadline``: no
cell started after that many seconds).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

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
# Set for this process only, where the caller has not (its JAX backend
# holds a GPU while the authors' processes run on it); jsfl's runs get the
# caller's environment, so jsfl sets its allocator as it would for a user.
PARENT_ONLY_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
_SET_HERE: set[str] = set()
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
  its ``log``, and their CPU seconds (user + system, children included).
  Each job is a process group of its own, killed whole if this one is
  stopped (a time limit's SIGTERM) before it ends."""
  t0 = time.perf_counter()
  procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True, **kw)
           for cmd, _, kw in jobs]
  first: list[float | None] = [None] * len(jobs)
  live, cpu = {p.pid: i for i, p in enumerate(procs)}, 0.0
  try:
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
  finally:
    for pid in live:
      try:
        os.killpg(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  total = time.perf_counter() - t0
  for p, (cmd, _, _) in zip(procs, jobs, strict=True):
    if p.returncode:
      raise subprocess.CalledProcessError(p.returncode, cmd)
  return total, [total if f is None else f for f in first], cpu


def authors_run(cell: str, model: str, rounds: int, clone: str, py: str,
                procs: int = 1, device: str = "cpu", threads: int = 1,
                data_dir: str | None = None) -> dict:
  """``procs`` processes of ``threads`` torch threads side by side (seeds
  0..procs-1), as a user fills a machine with their code; ``device``:
  their ``--device`` (run.sh's ``DEVICE``); ``data_dir``: their
  ``FMNIST_DIR``."""
  with tempfile.TemporaryDirectory() as tmp:
    jobs = []
    for seed in range(procs):
      env = dict(os.environ, MODEL=model, ROUNDS=str(rounds), SEEDS=str(seed), CELLS=cell,
                 CLONE=clone, PY=py, THREADS=str(threads), DEVICE=device)
      if data_dir:
        env["FMNIST_DIR"] = data_dir
      out = os.path.join(tmp, str(seed))
      if model == "multisfl":  # its recipe: LOG_DIR/MultiSFL_seed<S>.jsonl
        env["ALGOS"] = "MultiSFL"
        jobs.append((["bash", MULTISFL_RECIPE, out],
                     os.path.join(out, f"MultiSFL_seed{seed}.jsonl"), {"env": env}))
        continue
      jobs.append((["bash", RECIPE, out], os.path.join(out, model, f"{cell}_seed{seed}.jsonl"),
                   {"env": env}))
    try:
      total, first, cpu = timed(jobs)
    except subprocess.CalledProcessError:
      logs = os.path.join(tmp, "0", model)  # seed 0's console output, gone with tmp
      for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else ():
        if name.endswith(".out"):
          with open(os.path.join(logs, name)) as f:
            print(f"# {name} (seed 0), its end:\n{f.read()[-3000:]}", file=sys.stderr)
      raise
    runs = [read_jsonl(log) for _, log, _ in jobs]
  speeds = [sum(r["samples"] for r in recs) / sum(r["train_s"] for r in recs) for recs in runs]
  n_rounds = len(runs[0])
  return {"side": "authors", "cell": cell, "seeds": procs, "procs": procs, "rounds": n_rounds,
          "samples_per_s_per_seed": statistics.median(speeds),
          "process_s_per_seed_run": total / procs, "first_round_s": statistics.median(first),
          "cpu_s_per_seed_round": cpu / (procs * n_rounds),
          "seed_runs_per_hour": 3600 * procs / total,
          "round_s": [r["train_s"] for r in runs[0]]}


def jsfl_run(cell: str, model: str, rounds: int, seeds: int, jsfl: list[str],
             cache: str = "off", data_dir: str | None = None) -> dict:
  """``jsfl``: the command's words; ``cache``: ``off`` (every program
  compiled in the timed run) or ``warm`` (a one-round run of the same cell
  and seeds fills a fresh compilation cache first, untimed: what every later
  run of a config finds); ``data_dir``: ``dataset.data_dir``."""
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, JSFL_COMPILE_CACHE="off" if cache == "off"
               else os.path.join(tmp, "cache"))
    for k in _SET_HERE:
      env.pop(k, None)
    data = [f"dataset.data_dir={data_dir}"] if data_dir else []

    def cmd(out, n):
      return [*jsfl, "run", os.path.join(ROOT, CONFIGS[model]), *CELLS[cell], *data,
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
  # rounds 2.. (round 1 compiles); round 1 when it is the only one (smoke runs)
  later = [r for r in recs if r["round"] > 1] or recs
  train = sum(walls[k] for k in {r["round"] for r in later})  # one record a slot a round
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


def authors_torch(py: str, device: str) -> dict:
  """The authors' side's torch: its version and the device it trains on."""
  code = ("import json, sys, torch; d = sys.argv[1]; print(json.dumps({'torch': "
          "torch.__version__, 'device': torch.cuda.get_device_name() if d == 'cuda' else d}))")
  got = subprocess.run([py, "-c", code, device], capture_output=True, text=True, check=False)
  return json.loads(got.stdout) if got.returncode == 0 else {"error": got.stderr[-500:]}


def write_data(out: str, subset: int = 6000, source: str | None = None) -> None:
  """Writes Fashion-MNIST's four IDX files (gzipped) into ``out`` with every
  training image outside ``dataset.train_subset = subset`` zeroed: the
  shapes jsfl's reader checks, ~7 MB instead of 31, and the same subset on
  both sides (jsfl's ``train_subset`` and the authors' ``--train_subset``
  draw it from the labels alone, which are kept whole).  Checked by loading
  jsfl's subset from both directories."""
  import numpy as np

  from jsfl.data import load_dataset
  from jsfl.data.idx import IDX_FILES, find_idx_files, load_idx_dataset
  src = load_idx_dataset("fashion_mnist", data_dir=source)
  # the indices dataset.train_subset keeps (jsfl.data's rule: per label its
  # share, largest remainders first, from one permutation of default_rng(0))
  y = src["y_train"]
  perm = np.random.default_rng(0).permutation(y.shape[0])
  labels, counts = np.unique(y, return_counts=True)
  quota = np.floor(counts * subset / y.shape[0]).astype(int)
  quota[np.argsort(-(counts * subset / y.shape[0] - quota), kind="stable")[
      :subset - quota.sum()]] += 1
  keep = np.concatenate([perm[y[perm] == lab][:q] for lab, q in zip(labels, quota, strict=True)])
  x = np.zeros_like(src["x_train"])
  x[keep] = src["x_train"][keep]
  os.makedirs(out, exist_ok=True)
  for key, arr in (("x_train", x), ("y_train", y), ("x_test", src["x_test"]),
                   ("y_test", src["y_test"])):
    arr = np.ascontiguousarray(arr, np.uint8)
    head = bytes([0, 0, 0x08, arr.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(os.path.join(out, IDX_FILES[key] + ".gz"), "wb", compresslevel=9) as f:
      f.write(head + arr.tobytes())
  a = load_dataset("fashion_mnist", data_dir=source, train_subset=subset)
  b = load_dataset("fashion_mnist", data_dir=out, train_subset=subset)
  same = (np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_train, b.y_train)
          and np.array_equal(a.x_test, b.x_test) and np.allclose(a.mean, b.mean)
          and np.allclose(a.std, b.std))
  if not same:
    raise SystemExit(f"--write-data {out}: its train_subset={subset} differs from the "
                     "source's (jsfl.data's subset rule changed: update write_data)")
  size = sum(p.stat().st_size for p in find_idx_files(out)[0].values())
  print(f"wrote {out}: Fashion-MNIST, {len(keep)} of {y.shape[0]} training images kept "
        f"(train_subset={subset}), the {len(src['y_test'])} test images; {size / 2**20:.1f} MiB")


def _default_jsfl() -> str:
  # the venv's jsfl when this script runs with the venv's python but the venv
  # is not activated; checked before the authors' side spends its minutes
  beside = os.path.join(os.path.dirname(sys.executable), "jsfl")
  return beside if os.access(beside, os.X_OK) else (shutil.which("jsfl") or "jsfl")


def summarize(rows: list[dict], cells: list[str], rounds: int, out=None) -> list[dict]:
  """Per cell run by both sides: the medians of the rows and the ratios;
  the table to ``out`` (a stream) when given."""
  def say(text):
    if out is not None:
      print(text, file=out)
  say(f"\n| cell | side | training samples/s (all seeds) | s per seed-run "
      f"({rounds} rounds) | CPU-s per seed-round | s to round 1 |")
  say("| --- | --- | --- | --- | --- | --- |")
  summary = []
  for cell in cells:
    med = {}
    for side in ("authors", "jsfl"):
      got = [r for r in rows if r["cell"] == cell and r["side"] == side]
      if not got:
        break
      med[side] = tuple(statistics.median(r[k] for r in got) for k in (
          "samples_per_s", "process_s_per_seed_run", "cpu_s_per_seed_round",
          "first_round_s"))
      say(f"| {cell} | {side} | {med[side][0]:,.0f} | {med[side][1]:.1f} | "
          f"{med[side][2]:.2f} | {med[side][3]:.1f} |")
    if len(med) < 2:
      continue
    summary.append({"cell": cell, "authors": med["authors"], "jsfl": med["jsfl"],
                    "samples_ratio": med["jsfl"][0] / med["authors"][0],
                    "seed_runs_per_hour": {side: 3600 / med[side][1] for side in med},
                    "seed_runs_per_hour_ratio": med["authors"][1] / med["jsfl"][1],
                    "cpu_ratio": med["authors"][2] / med["jsfl"][2]})
    say(f"| {cell} | jsfl / authors | {summary[-1]['samples_ratio']:.2f}x | "
        f"{summary[-1]['seed_runs_per_hour_ratio']:.2f}x seed-runs per hour | "
        f"{summary[-1]['cpu_ratio']:.2f}x (their CPU-s / jsfl's) | |")
  return summary


def main() -> None:
  t_start = time.perf_counter()
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", choices=sorted(CONFIGS), default="small_cnn")
  ap.add_argument("--cells", nargs="+", choices=sorted(CELLS),
                  default=["sfl_cyclic", "hydra_cyclic"])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--seeds", type=int, default=1, help="jsfl's slots per program")
  ap.add_argument("--procs", type=int, default=1,
                  help="the authors' processes side by side (one seed each)")
  ap.add_argument("--threads", type=int, default=1,
                  help="torch threads of each of the authors' processes")
  ap.add_argument("--device", default="cpu",
                  help="the authors' torch device (their --device: cpu, cuda; the Hydra models)")
  ap.add_argument("--data-dir", default=None,
                  help="Fashion-MNIST's IDX files for both sides (the authors' FMNIST_DIR, "
                       "jsfl's dataset.data_dir; default: each side's own search)")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--deadline", type=float, default=None,
                  help="seconds from the start after which no cell is started (default: none)")
  ap.add_argument("--cache", choices=("off", "warm"), default="off",
                  help="jsfl's compilation cache: off, or warm (filled by an untimed "
                       "one-round run of the same cell first)")
  ap.add_argument("--clone", default=os.environ.get("CLONE"),
                  help="the authors' adapted clone (default: /work/authors/Hydra, or "
                       "/work/authors/MultiSFL for --model multisfl)")
  ap.add_argument("--py", default=os.environ.get("PY", "/work/authors/venv/bin/python"))
  ap.add_argument("--jsfl", default=_default_jsfl(),
                  help="the jsfl command, words allowed (e.g. 'python3 -m jsfl'; default: "
                       "the one beside this Python, else on PATH)")
  ap.add_argument("--write-data", metavar="DIR", default=None,
                  help="only write Fashion-MNIST for --data-dir into DIR (the training "
                       "images outside the cells' 6,000-image subset zeroed) and exit")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  if args.write_data:
    write_data(args.write_data, source=args.data_dir)
    return
  args.clone = os.path.abspath(args.clone or CLONES[args.model])
  if args.data_dir:
    args.data_dir = os.path.abspath(args.data_dir)
  jsfl = shlex.split(args.jsfl)
  if not jsfl or shutil.which(jsfl[0]) is None:
    ap.error(f"--jsfl {args.jsfl}: not an executable; allowed: a jsfl command "
             "(install jsfl into this Python's environment, or pass its path, "
             "or 'PYTHON -m jsfl')")
  if args.model == "multisfl" and args.cells == ap.get_default("cells"):
    args.cells = ["multisfl"]
  if args.model == "multisfl" and (args.device != "cpu" or args.data_dir):
    ap.error("--device and --data-dir are for the Hydra models; allowed with "
             "--model multisfl: neither")
  bad = [c for c in args.cells if c not in MODEL_CELLS[args.model]]
  if bad:
    ap.error(f"--cells {' '.join(bad)} for --model {args.model}; allowed: "
             f"{', '.join(MODEL_CELLS[args.model])}")

  # a time limit's SIGTERM ends the runs in flight too (timed's finally)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  for k, v in PARENT_ONLY_ENV.items():
    if k not in os.environ:
      os.environ[k] = v
      _SET_HERE.add(k)
  flops = train_flops_per_sample(args.model)
  peak = matmul_flops_per_s()
  print(f"# {flops / 1e6:.2f} MFLOP per training sample (XLA); matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s", flush=True)
  path = _results.path(args.out, "hydra_vs_authors", args.model, _results.host())
  head = {"machine": _results.machine(), "authors_torch": authors_torch(args.py, args.device),
          "args": vars(args), "train_flops_per_sample": flops,
          "matmul_peak_flops_per_s": peak}
  rows: list[dict] = []

  def write(finished: bool, skipped: list[str]) -> None:
    _results.write_json(path, {**head, "finished": finished, "not_started": skipped,
                               "rows": rows, "summary": summarize(rows, args.cells, args.rounds)})

  skipped: list[str] = []
  write(False, skipped)  # the machine and settings, kept if the runs are stopped
  for rep in range(args.repeats):
    for cell in args.cells:
      if args.deadline is not None and time.perf_counter() - t_start > args.deadline:
        skipped.append(f"{cell} (repeat {rep})")
        print(f"# {cell}, repeat {rep}: not started (past --deadline {args.deadline:g} s)",
              flush=True)
        continue
      for side in ("authors", "jsfl"):
        row = (authors_run(cell, args.model, args.rounds, args.clone, args.py, args.procs,
                           args.device, args.threads, args.data_dir)
               if side == "authors" else
               jsfl_run(cell, args.model, args.rounds, args.seeds, jsfl, args.cache,
                        args.data_dir))
        row["repeat"] = rep
        # all the machine's training: every process or slot side by side
        row["samples_per_s"] = row["samples_per_s_per_seed"] * row["seeds"]
        # every process or slot of the row trains at samples_per_s_per_seed
        row["gflop_per_s"] = row["samples_per_s_per_seed"] * row["seeds"] * flops / 1e9
        row["of_peak"] = row["gflop_per_s"] * 1e9 / peak
        rows.append(row)
        write(False, skipped)
        print(f"{cell:<14} {side:<8} {row['samples_per_s_per_seed']:8.0f} samples/s/seed  "
              f"{row['process_s_per_seed_run']:6.1f} s/seed-run  "
              f"{row['seed_runs_per_hour']:7.1f} seed-runs/h  "
              f"{row['cpu_s_per_seed_round']:6.2f} CPU-s/seed-round  "
              f"{row['first_round_s']:5.1f} s to round 1  "
              f"{row['gflop_per_s']:5.1f} GFLOP/s ({row['of_peak']:.0%} of peak)", flush=True)

  summarize(rows, args.cells, args.rounds, out=sys.stdout)
  write(True, skipped)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
