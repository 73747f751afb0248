"""The ``jsfl`` command line: ``jsfl run``, ``sweep``, ``partition``, ``report``, ``plot``,
``landscape``.

Exit codes: 0 success; 2 a bad config, argument, file or directory, a fault
of the machine (disk full, no permission) or a diverged run: one line on
stderr naming the value or file and what is allowed, and nothing new left on
disk (a diverged run keeps its directory, whose summary names the seeds);
1 a bug in jsfl (marked as such, its traceback after) or a sweep cell that
failed;
130 / 143 a run stopped by SIGINT / SIGTERM after a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys

from jsfl import __version__
from jsfl.errors import OutputError, UserError, os_error_line

RUN_HELP = """\
Train one config.  CONFIG is a TOML file (see docs/config.md; every key is
optional).  Overrides are section.key=value pairs whose value is parsed as
TOML (strings may be bare), e.g.

  jsfl run experiments/core/fmnist_iid.toml method.name=fedavg run.seeds=5

The run directory (config.json, partition.json, metrics.jsonl, summary.json,
checkpoints/; see docs/run-directory.md) is printed at the end.  SIGTERM or
Ctrl-C stops after the current round with a checkpoint (exit 143 / 130);

  jsfl run --resume RUN_DIR

continues a stopped or killed run from its newest checkpoint, in place."""

REPORT_HELP = """\
Tables of one run, many runs, or a collected sweep.  Each RUN_DIR is a run
directory, or any directory to search for run directories.  Rows group the
runs by the config fields that differ between them (runs that differ only in
their seeds are pooled); figures are per seed the median of the last 5
evaluated rounds, then median +- std over seeds (accuracy, PG, BW).

  jsfl report runs/demo-20260101-120000
  jsfl report experiments/core/results/core --out experiments/core/results/core
  jsfl report experiments/multisfl/results/authors_he_lecun --by method.name,method.replay \
    --paired "multisfl, replay=adaptive"

--paired ROW adds a column: per seed number (same partition and initial
model across methods) each row's accuracy minus ROW's, the median of those
differences and in how many seeds the row is ahead.

Prints markdown; --out DIR also writes report.md, report.csv (one row per
table row) and report_seeds.csv (one row per run and seed).  Unreadable
metrics.jsonl lines are named (FILE:LINE) on stderr and skipped."""

PLOT_HELP = """\
PNG plots of runs (needs matplotlib: pip install 'jsfl[plot]'): learning
curves with a seed band, per-label accuracy over rounds, per-position accuracy
(cyclic orders), the partition per client, accuracy against communication.

  jsfl plot runs/demo-20260101-120000          # into runs/demo-.../plots
  jsfl plot runs/sweep --out figures

Prints the path of every PNG written."""

LANDSCAPE_HELP = """\
The loss landscape of a finished run: the filter-normalised 2-D slice of Li
et al. (NeurIPS 2018) that KoReA-SFL draws in its Fig. 4.  Restores the
run's final model from its newest checkpoint (the model the run evaluates:
part-1 and part-2 together; MultiSFL's master model), draws two Gaussian
directions from the seed, scales every filter to its weights' filter norm
(biases and BatchNorm held fixed) and evaluates loss and accuracy at
w + a d1 + b d2 on a GRID x GRID grid over [-SPAN, SPAN]^2, on a fixed
subset of SAMPLES samples of the training (or test) split.

  jsfl landscape runs/multisfl/paper/cifar10/<cell>
  jsfl landscape RUN_DIR --seed 3 --grid 31 --span 0.5 --data test --samples 0

Writes RUN_DIR/landscape/landscape-seed<S>.json (grid axes, loss, accuracy,
the centre, the options) and its contour plot landscape-seed<S>.png (with
matplotlib); jsfl plot over several such runs draws their loss contours side
by side (landscape.png).  See docs/analysis.md."""

SWEEP_HELP = """\
Run every cell of a sweep file: a base config, a [grid] of section.key =
[values] (Cartesian product) and optional [[cells]] of extra overrides.  Each
cell runs in OUT_DIR/NAME/<cell name>; finished cells are skipped, so rerun
the same command after a crash.  Cells that differ only in seeds, batchable
options (optim.lr, ...) and partition draws are the slots of one compiled
program, split back per cell when it ends (--dry-run: cells -> programs).

  jsfl sweep experiments/sweeps/example.toml --dry-run
  jsfl sweep experiments/sweeps/example.toml --shard $SLURM_ARRAY_TASK_ID/8
  jsfl sweep experiments/sweeps/example.toml --collect
  jsfl sweep experiments/core/core.toml --out-dir experiments/core/results --collect

Every cell config is validated before anything runs (exit 2).  See
docs/sweeps.md."""

PARTITION_HELP = """\
Partition a dataset and print per-client label counts (optionally save JSON).

  jsfl partition fashion_mnist dominant_label --clients 10 p=0.8
  jsfl partition femnist natural dataset.path=DIR --clients 50 group=true

Options named dataset.KEY go to the dataset (dataset.path, dataset.label_mode,
...: docs/setting.md#datasets), the others to the partition.
"""


class _Parser(argparse.ArgumentParser):
  """argparse with the CLI's one-line errors: the message and where the
  allowed forms are (``--help``), instead of a usage block first."""

  def error(self, message: str):
    raise UserError(f"{message}; see {self.prog} --help")


COMMANDS = ("run", "partition", "report", "plot", "landscape", "sweep", "info",
            "config-reference")


def _parser() -> argparse.ArgumentParser:
  p = _Parser(
      prog="jsfl", description="Split and sequential federated learning in JAX.")
  p.add_argument("--version", action="version", version=f"jsfl {__version__}")
  sub = p.add_subparsers(dest="command", metavar="COMMAND")
  r = sub.add_parser("run", help="train one config", description=RUN_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  r.add_argument("config", nargs="?", help="TOML config file (default: all defaults)")
  r.add_argument("overrides", nargs="*", metavar="section.key=value",
                 help="config overrides")
  r.add_argument("--quiet", action="store_true", help="no progress bar or table")
  d = r.add_argument_group("multi-host (docs/multihost.md)")
  d.add_argument("--distributed", action="store_true",
                 help="join a multi-process run with jax.distributed.initialize(); "
                 "only process 0 writes the run directory")
  d.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                 help="process 0's address (else $JSFL_COORDINATOR or the cluster's)")
  d.add_argument("--num-processes", type=int, default=None, metavar="N",
                 help="processes in the run (else $JSFL_NUM_PROCESSES or the cluster's)")
  d.add_argument("--process-id", type=int, default=None, metavar="I",
                 help="this process's rank (else $JSFL_PROCESS_ID or the cluster's)")
  r.add_argument("--resume", metavar="RUN_DIR", default=None,
                 help="continue this run directory from its newest checkpoint "
                 "(no CONFIG or overrides)")
  q = sub.add_parser("partition", help="partition a dataset and show label counts",
                     description=PARTITION_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  q.add_argument("dataset", help="dataset name, e.g. fashion_mnist or synthetic")
  from jsfl.partitions import PARTITIONS
  q.add_argument("name", help=f"partition family: {', '.join(PARTITIONS)}")
  q.add_argument("options", nargs="*", metavar="key=value",
                 help="partition options, e.g. alpha=0.1 or p=0.8 phi=1; dataset.KEY=VALUE "
                 "are dataset options, e.g. dataset.path=DIR")
  q.add_argument("--clients", type=int, default=10, help="number of clients K")
  q.add_argument("--seed", type=int, default=0, help="partition seed")
  q.add_argument("--train-size", type=float, default=1.0,
                 help="count only the part of each client's samples it trains on "
                 "(partition.train_size: Hugging Face's train_test_split at "
                 "--train-split-seed; the Hydra authors' Flower paths: 0.8)")
  q.add_argument("--train-split-seed", type=int, default=42,
                 help="seed of --train-size's split")
  q.add_argument("--data-dir", default=None, help="dataset directory")
  q.add_argument("--out", default=None, help="write the counts as JSON here")
  q.add_argument("--plot", default=None, metavar="PNG",
                 help="draw the counts here: a bar per client stacked by label "
                 "(Hydra Fig. 8; needs matplotlib)")
  for name, help_, desc in (("report", "tables of runs (markdown, CSV)", REPORT_HELP),
                            ("plot", "PNG plots of runs", PLOT_HELP)):
    t = sub.add_parser(name, help=help_, description=desc,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("paths", nargs="+", metavar="RUN_DIR",
                   help="run directories or trees holding them")
    t.add_argument("--out", default=None, help="output directory" + (
        "" if name == "report" else " (default: RUN_DIR/plots for one RUN_DIR, else ./plots)"))
    t.add_argument("--by", default=None, metavar="KEYS",
                   help="group by these comma-separated config fields (section.key) "
                   "instead of the fields that differ")
    t.add_argument("--last", type=int, default=5,
                   help="evaluated rounds per seed in its median (default 5)")
    if name == "report":
      t.add_argument("--best-ma", type=int, default=0, metavar="W",
                     help="add the MultiSFL authors' figure: per seed the best W-round "
                     "moving average of accuracy (W = 10 in their code)")
      t.add_argument("--paired", default=None, metavar="ROW",
                     help="compare every row's accuracy with this row (its label, "
                     "a unique part of it, or one of its run directories) seed by seed")
      t.add_argument("--reference", default=None, metavar="CSV",
                     help="the paper's figures (config fields, then reference and "
                     "optionally reference_std; # lines name the source) beside jsfl's")
  a = sub.add_parser("landscape", help="the loss landscape of a finished run (2-D slice)",
                     description=LANDSCAPE_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  a.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with checkpoints/")
  a.add_argument("--seed", type=int, default=None,
                 help="which of the run's seeds (default: its first); also draws the directions")
  a.add_argument("--grid", type=int, default=21, metavar="N",
                 help="points per axis, 3 to 501 (default 21; odd puts the model on the grid)")
  a.add_argument("--span", type=float, default=1.0, metavar="A",
                 help="the grid covers [-A, A] on either direction (default 1)")
  a.add_argument("--data", default="train", metavar="SPLIT",
                 help="train (default; the training loss, as Li et al.) or test")
  a.add_argument("--samples", type=int, default=2000, metavar="M",
                 help="a fixed subset of M samples drawn with the seed (default 2000; "
                 "0 = the whole split)")
  w = sub.add_parser("sweep", help="run a grid of configs (cells), skipping finished ones",
                     description=SWEEP_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  w.add_argument("sweep_file", help="sweep TOML file (see docs/sweeps.md)")
  w.add_argument("--shard", default=None, metavar="i/n",
                 help="only programs i, i+n, i+2n, ... (0 <= i < n), e.g. a job array's "
                 "task; programs are cut in whole cells when fewer than n")
  w.add_argument("--per-cell", action="store_true",
                 help="every cell its own program (its seeds its slots), not cells of one "
                 "static signature as slots of one")
  mode = w.add_mutually_exclusive_group()
  mode.add_argument("--collect", action="store_true",
                    help="report every cell into OUT_DIR/NAME/collected and print it")
  mode.add_argument("--dry-run", action="store_true",
                    help="list cells -> programs with their status (done, partial, todo)")
  w.add_argument("--out-dir", default=None, metavar="DIR",
                 help="cells under DIR/NAME/ instead of the file's sweep.out_dir (e.g. "
                 "a paper folder's results/ to list or collect its committed cells)")
  w.add_argument("--quiet", action="store_true", help="no progress bars")
  i = sub.add_parser("info", help="backend, devices, versions; how a config would run here",
                     description="Print the backend, devices and their memory, versions "
                     "and the compilation cache; with a config (and overrides), the "
                     "exec choices 'auto' resolves to on this machine and the round "
                     "program's memory by XLA's analysis, with the most seeds that fit.\n\n"
                     "  jsfl info\n  jsfl info experiments/hydra/fmnist.toml run.seeds=8",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  i.add_argument("config", nargs="?", default=None, help="TOML config (optional)")
  i.add_argument("overrides", nargs="*", help="section.key=value overrides")
  i.add_argument("--no-compile", action="store_true",
                 help="leave out the round program's memory (it loads the data and "
                 "compiles the program three times); the config is then checked "
                 "against the schema only, not against the data and model")
  sub.add_parser("config-reference", help="print the config reference (markdown)")
  return p


def _fail(msg: str) -> int:
  print(f"jsfl: error: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
  return 2


def _check_out_dir(path: str, flag: str) -> None:
  """An output directory that exists or can be made (checked before any work)."""
  from jsfl.rundir import check_parent
  if os.path.lexists(path) and not os.path.isdir(path):
    raise OutputError(f"{flag}={path!r} exists and is not a directory; allowed: a "
                      "directory (created if missing)")
  check_parent(path, flag, OutputError)


def _check_out_file(path: str, flag: str) -> None:
  """An output file whose directory exists and is writable."""
  if os.path.isdir(path):
    raise OutputError(f"{flag}={path!r} is a directory; allowed: a file path")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise OutputError(f"{flag}={path!r}: directory {os.path.dirname(path) or '.'!r} does "
                      "not exist; allowed: a file in an existing directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise OutputError(f"{flag}={path!r}: directory {parent!r} is not writable; allowed: "
                      "a file in a writable directory")


def cmd_run(args) -> int:
  given = [flag for flag, value in (("--coordinator", args.coordinator),
                                    ("--num-processes", args.num_processes),
                                    ("--process-id", args.process_id)) if value is not None]
  if given and not args.distributed:
    return _fail(f"{given[0]} without --distributed; allowed: --distributed with it (one "
                 "process of a multi-host run), or none of these flags")
  if args.distributed:  # before anything else touches a jax backend
    from jsfl import distributed
    try:
      distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    except ValueError as e:
      return _fail(str(e))
  from jsfl import config as config_lib
  if args.resume is not None:
    return _resume(args)
  if args.config and "=" in args.config and not os.path.exists(args.config):
    args.overrides.insert(0, args.config)  # no config file: all overrides
    args.config = None
  try:
    cfg = config_lib.load_config(args.config, args.overrides)
    if args.quiet:
      cfg["exec"]["progress"] = False
    from jsfl import rundir, train
    run = config_lib.typed(cfg).run
    rundir.check_target(run.out_dir, run.name, run.dir)
    exp = train.prepare(cfg)
  except config_lib.ConfigError as e:
    return _fail(str(e))
  from jsfl import report, train
  out = train.run(cfg, exp)
  from jsfl.distributed import is_writer
  if not args.quiet and is_writer():  # only process 0 has the files
    print(report.summary_table(out))
  print(out)
  return 0


def _resume(args) -> int:
  from jsfl import config as config_lib
  if args.config or args.overrides:
    given = " ".join(([args.config] if args.config else []) + list(args.overrides))
    return _fail(f"--resume takes only RUN_DIR (the run's own config is used); "
                 f"got also: {given}")
  from jsfl import report, train
  try:
    out = train.resume(args.resume, progress=False if args.quiet else None)
  except config_lib.ConfigError as e:
    return _fail(str(e))
  from jsfl.distributed import is_writer
  if not args.quiet and is_writer():
    print(report.summary_table(out))
  print(out)
  return 0


def _parse_kv(items, prefix=""):
  """``KEY=VALUE`` options of ``jsfl partition`` (``prefix``: how the user
  wrote them, ``dataset.`` for the dataset's), values parsed as TOML."""
  from jsfl.config import ConfigError, parse_override
  opts = {}
  for it in items:
    key = it.partition("=")[0].strip()
    if "=" not in it or not key or "." in key:
      raise ConfigError(f"option {prefix + it!r} is not KEY=VALUE; allowed: KEY=VALUE for "
                        "the partition (e.g. alpha=0.1) or dataset.KEY=VALUE")
    _, k, v = parse_override(f"p.{it}")
    opts[k] = v
  return opts


def _split_dataset_kv(items):
  """``dataset.KEY=VALUE`` items (dataset options), then the others."""
  data = [it.removeprefix("dataset.") for it in items if it.startswith("dataset.")]
  return data, [it for it in items if not it.startswith("dataset.")]


def cmd_partition(args) -> int:
  import numpy as np

  from jsfl import partitions
  from jsfl.config import ConfigError
  from jsfl.data import load_dataset
  if args.out:
    _check_out_file(args.out, "--out")
  if args.plot:
    _check_out_file(args.plot, "--plot")
    if not args.plot.endswith(".png"):
      return _fail(f"--plot={args.plot!r}; allowed: a path ending in .png")
    from jsfl import plots
    try:
      plots.require_matplotlib()
    except plots.MissingDependency as e:  # as `jsfl plot`: not bad input
      print(f"jsfl: error: {e}", file=sys.stderr)
      return 1
  if args.clients < 1:
    return _fail(f"--clients={args.clients}; allowed: an int >= 1")
  try:
    data_items, part_items = _split_dataset_kv(args.options)
    data_opts, opts = _parse_kv(data_items, "dataset."), _parse_kv(part_items)
    ds = load_dataset(args.dataset, data_dir=args.data_dir, **data_opts)
    parts = partitions.make_partition(args.name, ds.y_train, args.clients,
                                      seed=args.seed, num_classes=ds.num_classes,
                                      client_ids=ds.client_ids, **opts)
    if args.train_split_seed < 0:
      raise ValueError(f"--train-split-seed={args.train_split_seed}; allowed: an int >= 0")
    parts = partitions.train_split(parts, args.train_size, args.train_split_seed)
  except (ValueError, TypeError, ConfigError) as e:
    return _fail(str(e))
  counts = partitions.label_counts(parts, ds.y_train, ds.num_classes)
  L = ds.num_classes
  head = "client " + " ".join(f"{lab:>6}" for lab in range(L)) + "   total  dominant"
  print(head)
  for c, row in enumerate(counts):
    print(f"{c:>6} " + " ".join(f"{v:>6}" for v in row)
          + f" {row.sum():>7} {int(np.argmax(row)):>9}")
  if args.out:
    from jsfl.rundir import write_json_atomic
    write_json_atomic(args.out, {"dataset": args.dataset, "partition": args.name,
                                 "options": opts, "seed": args.seed,
                                 **({"train_size": args.train_size,
                                     "train_split_seed": args.train_split_seed}
                                    if args.train_size != 1 else {}),
                                 **({"dataset_options": data_opts} if data_opts else {}),
                                 "label_counts": counts, "sizes": counts.sum(1)})
    print(f"saved {args.out}")
  if args.plot:
    opts_text = "".join(f" {k}={v}" for k, v in opts.items())
    plots.label_count_bars(counts, plots.dataset_label_names(args.dataset, L),
                           f"{args.dataset}: {args.name}{opts_text}, {args.clients} clients "
                           f"(seed {args.seed})", args.plot)
    print(f"saved {args.plot}")
  return 0


def _warn(problems) -> None:
  for msg in problems:
    print(f"jsfl: warning: {msg}", file=sys.stderr)


def _no_runs(paths, problems) -> str:
  why = f" ({'; '.join(problems[:3])}{'; ...' if len(problems) > 3 else ''})" if problems else ""
  return (f"no run with a usable metrics.jsonl in {' '.join(paths)}{why}; allowed: run "
          "directories, or directories holding them")


def cmd_report(args) -> int:
  from jsfl import report
  if args.last < 1:
    return _fail(f"--last={args.last}; allowed: an int >= 1")
  if args.best_ma < 0:
    return _fail(f"--best-ma={args.best_ma}; allowed: an int >= 1 (0 = off)")
  by = [k.strip() for k in args.by.split(",") if k.strip()] if args.by else None
  if args.out:
    _check_out_dir(args.out, "--out")
  try:
    rep = report.build_report(args.paths, by=by, last=args.last,
                              paired_with=args.paired, best_ma=args.best_ma,
                              reference=args.reference, strict_by=True)
  except ValueError as e:
    return _fail(str(e))
  if not rep.rows:  # one line, the notes on each path folded into it
    return _fail(_no_runs(args.paths, rep.problems))
  _warn(rep.problems)
  print(report.to_markdown(rep))
  if args.out:
    for path in report.write_report(rep, args.out):
      print(f"wrote {path}")
  return 0


def cmd_plot(args) -> int:
  from jsfl import plots
  if args.last < 1:
    return _fail(f"--last={args.last}; allowed: an int >= 1")
  by = [k.strip() for k in args.by.split(",") if k.strip()] if args.by else None
  out = args.out
  if not out and len(args.paths) == 1:  # beside the one run or tree plotted
    from jsfl.reading import metrics_file_dir
    path = metrics_file_dir(args.paths[0]) or args.paths[0]
    if not os.path.isdir(path):
      return _fail(f"{path!r} is neither a directory nor a metrics file; allowed: run "
                   "directories, directories holding them, or a run's metrics.jsonl")
    out = os.path.join(path, "plots")
  out = out or "plots"
  _check_out_dir(out, "--out")
  try:
    pngs, problems = plots.plot_runs(args.paths, out, by=by, last=args.last, strict_by=True)
  except plots.MissingDependency as e:
    print(f"jsfl: error: {e}", file=sys.stderr)
    return 1
  if not pngs:
    return _fail(_no_runs(args.paths, problems))
  _warn(problems)
  for p in pngs:
    print(p)
  return 0


def cmd_landscape(args) -> int:
  from jsfl.train import landscape
  opts = landscape.Options(seed=args.seed, grid=args.grid, span=args.span, data=args.data,
                           samples=args.samples)
  path, result = landscape.landscape(args.run_dir, opts)
  if result["round"] < result["rounds"]:
    print(f"jsfl: warning: {args.run_dir} is not finished: the landscape is of its newest "
          f"checkpoint, round {result['round']} of {result['rounds']}", file=sys.stderr)
  print(path)
  from jsfl import plots
  try:
    print(plots.landscape_contour(path, path.removesuffix(".json") + ".png"))
  except plots.MissingDependency as e:  # the data is written; the picture is optional
    print(f"jsfl: warning: no contour plot: {e}", file=sys.stderr)
  return 0


def cmd_info(args) -> int:
  from jsfl import config as config_lib
  if args.config and "=" in args.config and not os.path.exists(args.config):
    args.overrides.insert(0, args.config)
    args.config = None
  cfg = None
  if args.config or args.overrides:
    cfg = config_lib.load_config(args.config, args.overrides)
  from jsfl.train.info import info
  print(info(cfg, compiled=not args.no_compile))
  return 0


def cmd_sweep(args) -> int:
  from jsfl import config as config_lib
  from jsfl import sweep
  try:
    return sweep.main(args.sweep_file, shard_spec=args.shard, collect_only=args.collect,
                      dry_run=args.dry_run, quiet=args.quiet, per_cell=args.per_cell,
                      out_dir=args.out_dir)
  except config_lib.ConfigError as e:
    return _fail(str(e))


# Faults of the machine rather than of jsfl: one line, like a bad input.
_ENV_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                         errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                         errno.ENAMETOOLONG, errno.ELOOP, errno.EMFILE})


def main(argv=None) -> int:
  """The error boundary of every subcommand: a :class:`UserError` or a fault
  of the machine is one line and exit 2; anything else is a bug, shown with
  its traceback and said to be one."""
  try:
    return _dispatch(argv)
  except UserError as e:
    return _fail(str(e))
  except BrokenPipeError:  # `jsfl sweep --dry-run | head`: the reader has gone
    with contextlib.suppress(OSError):
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + 13  # as a process killed by SIGPIPE
  except OSError as e:
    if e.errno not in _ENV_ERRNOS:
      raise
    return _fail(os_error_line(e))
  except KeyboardInterrupt:  # before a run's own handler is installed
    print("jsfl: interrupted", file=sys.stderr)
    return 130
  except SystemExit:
    raise
  except Exception:
    # A bug: say so, then let it propagate so its traceback follows (and
    # in-process callers get the exception itself); the exit status is 1.
    print(f"jsfl: internal error: this is a bug in jsfl {__version__}, not a problem with "
          "your input; please report it with the traceback below and the command",
          file=sys.stderr, flush=True)
    raise


def _glue_shard(argv: list[str]) -> list[str]:
  """``--shard -1/2`` as ``--shard=-1/2``: argparse reads a value that starts
  with '-' (and is not a plain negative number) as a flag, so the value would
  be reported missing rather than named with what is allowed."""
  out, i = [], 0
  while i < len(argv):
    if argv[i] == "--shard" and argv[i + 1:i + 2] and argv[i + 1][1:2].isdigit() \
        and argv[i + 1].startswith("-"):
      out.append(f"--shard={argv[i + 1]}")
      i += 2
    else:
      out.append(argv[i])
      i += 1
  return out


def _dispatch(argv=None) -> int:
  from jsfl.allocator import configure
  configure()  # before the command's first JAX call starts the backend
  parser = _parser()
  argv = _glue_shard(list(sys.argv[1:] if argv is None else argv))
  # key=value pairs may follow --flags; argparse alone would reject them there.
  args, extra = parser.parse_known_args(argv)
  bad = [e for e in extra if "=" not in e or e.startswith("-")]
  if bad or (extra and args.command not in ("run", "partition", "info")):
    where = f"jsfl {args.command}" if args.command else "jsfl"
    _Parser(prog=where).error(f"unrecognized arguments: {' '.join(bad or extra)}")
  if args.command == "run":
    args.overrides = list(args.overrides) + extra
  elif args.command == "partition":
    args.options = list(args.options) + extra
  elif args.command == "info":
    args.overrides = list(args.overrides) + extra
  if args.command == "run":
    return cmd_run(args)
  if args.command == "partition":
    return cmd_partition(args)
  if args.command == "report":
    return cmd_report(args)
  if args.command == "plot":
    return cmd_plot(args)
  if args.command == "sweep":
    return cmd_sweep(args)
  if args.command == "info":
    return cmd_info(args)
  if args.command == "landscape":
    return cmd_landscape(args)
  if args.command == "config-reference":
    from jsfl.config import markdown_reference
    print(markdown_reference())
    return 0
  return _fail(f"no command; allowed: {', '.join(COMMANDS)} (jsfl --help)")


if __name__ == "__main__":
  sys.exit(main())
