"""How far seeds fill one accelerator: a seed-batched SFL round, old and new
lowerings side by side.

Each cell is one ``jsfl run``-shaped round program (synthetic CIFAR-shaped
data, 32x32x3, 10 classes, 10 clients of ``--batch`` samples each, so a
round is one batch step of every client and ten server visits), built
through the library's own config and programs, in its own process (its
compile time and peak memory are its own):

* ``new``: today's ``auto`` choices (``exec.client_pass``,
  ``model.conv_impl``, ``model.depthwise_impl`` as they resolve here);
* ``old``: the lowering before them (``xla`` convolutions, ``grouped``
  depthwise, ``client_pass = batched``), the figures of the first GPU
  measurement;
* ``bf16``: ``new`` with ``exec.precision = "bfloat16"``;
* ``xla``: ``new`` with XLA's convolutions (their seed-aware VJP), the
  memory-lean choice for spatial kernels;
* ``patches``: ``new`` with im2col's kernel gradient from the patch matrix
  (``model.im2col_grad``; the CPU's default, faster there, larger
  temporaries), against ``new``'s per-tap form;
* ``graphs``: ``new`` with XLA:GPU's command buffers (CUDA graphs) also
  recording loops and branches (``+WHILE,+CONDITIONAL``): a round's scans
  over visits and batch steps, and the cond that skips a padded step, then
  replay as graphs instead of each iteration's kernels being launched, and
  its condition read back, by the host (the flag does nothing elsewhere).

Per cell: samples/s (median of ``--repeats`` timed rounds), compile
seconds, JAX's peak bytes in use, XLA's memory analysis and, for the first
cell, a census of the compiled program's cuDNN / cuBLAS calls (its
optimised HLO).  ``--profile N`` traces N more rounds of every cell with
JAX's profiler after the timed ones and adds ``trace_summary.py``'s reading
(the device's busy fraction of the rounds' wall time, kernels and
device-to-host copies a round, the costliest ops) as the row's ``trace``;
the traces themselves go into one ``fill-traces.tar`` beside the JSON
(``MODEL-SEEDS-LOWERING.trace.json.gz`` members, appended as cells finish,
while the archive stays under ``--trace-mib``: a GPU lease returns a few
files of bounded size).  Rows are written as they finish
(``fill-partial.json``); ``--deadline`` stops starting cells.

Usage::

  python benchmarks/fill.py                          # the GPU grid
  python benchmarks/fill.py --smoke                  # toy sizes, any backend
"""

from __future__ import annotations

import os

# cells run one after another in their own processes: none may hold 75%
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import json
import statistics
import subprocess
import sys
import time

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))

OLD = ["model.conv_impl=xla", "model.depthwise_impl=grouped", "exec.client_pass=batched"]
LOWERINGS = {"new": [], "old": OLD, "bf16": ["exec.precision=bfloat16"],
             # XLA's convolutions with their seed-aware VJP, the rest as new
             "xla": ["model.conv_impl=xla"],
             "patches": ["model.im2col_grad=patches"], "graphs": []}
# lowerings that differ in the compiler's flags (the worker's environment)
LOWERING_XLA_FLAGS = {"graphs": "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"}

# (model, seeds, lowering): the most telling first, so a time limit cuts the rest
GRID = [("mobilenet_v1", 16, "new"), ("mobilenet_v1", 1, "new"), ("mobilenet_v1", 64, "new"),
        ("mobilenet_v1", 16, "old"), ("mobilenet_v1", 16, "bf16"), ("resnet18", 8, "new"),
        ("resnet18", 1, "new"), ("resnet18", 8, "xla"), ("resnet18", 8, "old"),
        ("resnet18", 32, "new"),
        ("mobilenet_v1", 1, "old"), ("resnet18", 1, "old"), ("mobilenet_v1", 64, "old"),
        ("resnet18", 32, "old"), ("resnet18", 8, "patches"), ("mobilenet_v1", 16, "graphs"),
        ("resnet18", 8, "graphs")]
# the smoke test checks the plumbing (old lowering, bfloat16, the census) on
# the cheapest model to compile
SMOKE = [("small_cnn", 2, "old"), ("small_cnn", 1, "bf16"), ("small_cnn", 1, "graphs")]


def overrides(model, seeds, lowering, args) -> list[str]:
  clients, batch = args.clients, args.batch
  width = [f"model.width={args.width}"] if args.width else []
  return [
      "dataset.name=synthetic", f"dataset.input_shape=[{args.size}, {args.size}, 3]",
      "dataset.num_classes=10",
      f"dataset.train_size={clients * batch}", "dataset.test_size=100",
      f"model.name={model}", *width, "method.name=sfl", f"method.batch_size={batch}",
      f"partition.num_clients={clients}", f"run.seeds={seeds}", "optim.lr=0.01",
      "optim.momentum=0.5", "exec.seed_exec=vmap", "exec.client_exec=vmap",
      "exec.progress=false", "exec.compile_cache=off",
      *LOWERINGS[lowering]]


def cell_env(lowering: str) -> dict:
  """The worker's environment: this one's, with the lowering's XLA flags
  appended to any the user set."""
  env = dict(os.environ)
  extra = LOWERING_XLA_FLAGS.get(lowering)
  if extra:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
  return env


def profile_rounds(compiled, state, slot, shared, keys, first: int, rounds: int,
                   keep: str | None) -> dict:
  """Traces ``rounds`` calls of the round program with JAX's profiler and
  reads the trace (:mod:`trace_summary`); ``keep``: where to copy the
  trace (the parent archives it: :func:`archive_trace`)."""
  import glob
  import shutil
  import tempfile

  import jax
  from trace_summary import load, summarize

  from jsfl.train import programs
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp, create_perfetto_trace=True)
    t = time.perf_counter()
    for r in range(first, first + rounds):
      state, m = compiled(state, slot, programs.round_keys(keys, r), shared)
      jax.block_until_ready((state, m))
    wall = time.perf_counter() - t
    jax.profiler.stop_trace()
    (path,) = glob.glob(f"{tmp}/plugins/profile/*/*.trace.json.gz")
    summary = summarize(load(path), rounds, wall)
    if keep:
      os.makedirs(os.path.dirname(keep), exist_ok=True)
      shutil.copyfile(path, keep)
  return summary


def archive_trace(trace: str, tar_path: str, budget_mib: float) -> str | None:
  """Appends ``trace`` to the tar at ``tar_path`` (its name less the leading
  dot) unless that would take the archive past ``budget_mib``; removes
  ``trace`` either way.  Returns ``TAR:MEMBER`` where it was kept."""
  import tarfile
  member = os.path.basename(trace).lstrip(".")
  size = os.path.getsize(trace) + 1024 + (os.path.getsize(tar_path)
                                          if os.path.exists(tar_path) else 10240)
  kept = None
  if size <= budget_mib * 2**20:
    with tarfile.open(tar_path, "a") as tar:
      tar.add(trace, arcname=member)
    kept = f"{os.path.basename(tar_path)}:{member}"
  os.remove(trace)
  return kept


def worker(cell: dict, repeats: int, census_calls: bool) -> dict:
  """One cell in this process: compile, time, measure."""
  import jax

  sys.path.insert(0, HERE)
  from seed_kernels import census

  from jsfl import config as config_lib
  from jsfl.train import experiment, fit, programs
  cfg = config_lib.load_config(None, cell["overrides"])
  exp = experiment.prepare(cfg)
  init, rnd, _ = programs.build_programs(exp)
  slot, shared = programs.split_data(exp.data)
  keys = programs.make_seed_keys(exp.seeds)
  state = programs.commit(init(keys), None)
  jax.block_until_ready(state)
  t = time.perf_counter()
  compiled = fit.compile_round(rnd, init, keys, slot, shared, len(exp.seeds))
  compile_s = time.perf_counter() - t
  from jsfl.models import layers
  m_cfg = cfg["model"]

  def lowering(key):  # the model's ``auto`` as resolved on this backend
    v = m_cfg.get(key, "auto")
    return getattr(layers, f"default_{key}")() if v == "auto" else v
  # every choice that changes the program, so a row says what it timed
  out = {"machine": _results.machine(), "compile_s": round(compile_s, 2),
         "program_bytes": fit.program_bytes(compiled),
         **{k: lowering(k) for k in ("conv_impl", "depthwise_impl", "im2col_grad",
                                     "im2col_narrow")},
         "client_pass": exp.setup.client_pass, "client_exec": exp.setup.client_exec,
         "seed_exec": exp.seed_exec, "precision": cfg["exec"]["precision"]}
  mem = compiled.memory_analysis()
  if mem is not None:
    out["temp_bytes"] = int(mem.temp_size_in_bytes)
  if census_calls:
    out["census"] = census(compiled.as_text() or "")
  samples = len(exp.seeds) * exp.setup.clients_per_round * exp.setup.batch_size
  times = []
  for r in range(repeats + 1):
    t = time.perf_counter()
    state, m = compiled(state, slot, programs.round_keys(keys, r), shared)
    jax.block_until_ready((state, m))
    if r:
      times.append(time.perf_counter() - t)
  stats = jax.devices()[0].memory_stats() or {}
  out.update(round_s=statistics.median(times), times_s=[round(x, 5) for x in times],
             samples_per_round=samples,
             samples_per_s=round(samples / statistics.median(times), 1),
             peak_bytes=stats.get("peak_bytes_in_use"),
             loss=float(jax.numpy.mean(m["loss"])))
  if cell.get("profile"):
    out["trace"] = profile_rounds(compiled, state, slot, shared, keys, repeats + 1,
                                  cell["profile"], cell.get("trace_file"))
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--smoke", action="store_true", help="toy sizes (any backend)")
  ap.add_argument("--clients", type=int, default=10)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--width", type=float, default=None)
  ap.add_argument("--size", type=int, default=32, help="image side (32: CIFAR)")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--cells", nargs="*", default=None,
                  help="MODEL:SEEDS:LOWERING cells instead of the grid")
  ap.add_argument("--deadline", type=float, default=None,
                  help="seconds after which no further cell is started")
  ap.add_argument("--cell-timeout", type=float, default=300)
  ap.add_argument("--profile", type=int, default=0, metavar="N",
                  help="trace N more rounds of each cell with JAX's profiler (0: off)")
  ap.add_argument("--trace-mib", type=float, default=14,
                  help="most MiB of traces kept in fill-traces.tar")
  ap.add_argument("--out", default=_results.DIR)
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    cell = json.loads(args.worker)
    print("RESULT " + json.dumps(worker(cell, cell["repeats"], cell["census"])), flush=True)
    return
  if args.smoke:
    args.clients, args.batch, args.width, args.repeats, args.size = 2, 8, 4, 1, 16
  for c in args.cells or []:
    parts = c.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or parts[2] not in LOWERINGS:
      ap.error(f"--cells {c!r}: allowed MODEL:SEEDS:LOWERING, SEEDS a number, LOWERING "
               f"one of {', '.join(LOWERINGS)}")
  grid = ([tuple(c.split(":")) for c in args.cells] if args.cells
          else SMOKE if args.smoke else GRID)
  # the parent starts no backend (a GPU context of its own would hold memory):
  # the machine comes from the cells
  res = {"machine": None, "clients": args.clients, "batch": args.batch,
         "width": args.width, "size": args.size, "rows": [],
         "command": "python benchmarks/fill.py " + " ".join(sys.argv[1:])}
  start = time.perf_counter()
  for i, (model, seeds, lowering) in enumerate(grid):
    row = {"model": model, "seeds": int(seeds), "lowering": lowering}
    if args.deadline is not None and time.perf_counter() - start > args.deadline:
      res.setdefault("skipped", []).append(row)
      continue
    cell = {"overrides": overrides(model, int(seeds), lowering, args),
            "repeats": args.repeats, "census": i == 0, "profile": args.profile,
            "trace_file": os.path.join(os.path.abspath(args.out),
                                       f".{model}-{seeds}-{lowering}.trace.json.gz")}
    t = time.perf_counter()
    try:
      proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cell)],
                            capture_output=True, text=True, timeout=args.cell_timeout,
                            check=False, env=cell_env(lowering))
      lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
      if lines:
        row.update(json.loads(lines[-1][7:]))
      else:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        row["error"] = " | ".join(tail)[-400:]
    except subprocess.TimeoutExpired:
      row["error"] = f"timed out after {args.cell_timeout:.0f} s"
    row["wall_s"] = round(time.perf_counter() - t, 1)
    if os.path.exists(cell["trace_file"]):
      kept = archive_trace(cell["trace_file"], os.path.join(args.out, "fill-traces.tar"),
                           args.trace_mib)
      if "trace" in row:
        row["trace"]["file"] = kept
    if row.get("machine"):
      res["machine"] = res["machine"] or row["machine"]
      del row["machine"]
      if len(res["rows"]) == 0:
        print(res["machine"], flush=True)
    res["rows"].append(row)
    print(f"{model:13s} S={int(seeds):3d} {lowering:4s} " + (
        row["error"] if "error" in row else
        f"{row['samples_per_s']:11,.0f} samples/s  compile {row['compile_s']:6.1f} s  "
        f"peak {(row.get('peak_bytes') or 0) / 2**30:6.2f} GiB  program "
        f"{(row.get('program_bytes') or 0) / 2**30:6.2f} GiB"), flush=True)
    for dev in row.get("trace", {}).get("devices", []):
      print(f"  trace: {dev['device']} busy {dev.get('busy_fraction', 0):.0%} of the round, "
            f"{dev['kernels_per_round']:,.0f} kernels (median {dev['median_kernel_us']} us), "
            f"{dev['device_to_host_copies_per_round']:,.0f} device-to-host copies a round",
            flush=True)
    _results.write_partial(args.out, "fill", res)
  backend = (res["machine"] or {}).get("backend", "unknown")
  path = _results.write_json(_results.path(args.out, "fill", backend, _results.host()), res)
  _results.drop_partial(args.out, "fill")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
