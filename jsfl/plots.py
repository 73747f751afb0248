"""PNG plots of run directories (``jsfl plot``); needs matplotlib (``jsfl[plot]``).

Like :mod:`jsfl.report`, this reads only the run-directory contract and
imports no jax.  Runs are grouped as in the report (config fields that differ;
runs that differ only in their seeds are pooled).  The plots:

* ``curves.png``: test accuracy and PG per evaluated round, one line per
  group (median over seeds) with a band from the lowest to the highest seed;
* ``heatmap_<group>.png``: per-label accuracy over rounds (median over seeds);
* ``per_position.png``: accuracy per position of the label cycle (cyclic
  orders with dominant-label partitions; Hydra Fig. 6);
* ``partition_<group>.png``: the partition of the first seed, one stacked bar
  of label counts per client;
* ``accuracy_vs_communication.png``: accuracy against cumulative bytes up +
  down (median over seeds);
* ``landscape.png``: where runs hold ``jsfl landscape`` files
  (``RUN_DIR/landscape/landscape-seed<S>.json``), the loss contours of each
  group's first such file side by side on shared levels (KoReA-SFL Fig. 4);
  :func:`landscape_contour` draws one file's loss and accuracy.
* ``confusion_steps_<group>.png``: runs with ``run.step_confusion``: the
  test-set confusion matrix after each step of the last recorded round, a row
  of heatmaps (the group's first run and seed; Hydra Fig. 11);
* ``classwise_steps_<group>.png``: the same runs' per-class test accuracy
  after every recorded step, the recorded rounds one after another, with the
  forgetting measure of the sequence (the group's first run and seed; SFedKD
  Fig. 1), and its median and range over that run's seeds.

Every figure has a fixed size (``SIZES`` at ``DPI``), so a plot's pixel size
does not depend on the data.
"""

from __future__ import annotations

import glob
import json
import os
import re
import textwrap
from collections.abc import Sequence

import numpy as np

from jsfl import report, rundir, statistics

DPI = 100
SIZES = {  # inches; pixels = inches * DPI
    "curves": (12.0, 4.5),
    "heatmap": (9.0, 5.0),
    "per_position": (8.0, 4.5),
    "partition": (9.0, 5.0),
    "communication": (8.0, 4.5),
    "landscape": (11.0, 4.8),
    "landscapes": (12.0, 4.8),
    "step_confusion": (16.0, 4.0),
    "step_accuracy": (12.0, 4.5),
}
STEP_CONFUSION = "confusion_steps.npz"  # jsfl.train.records.STEP_CONFUSION
MAX_STEP_PANELS = 10  # heatmaps in the row: the round's first steps
# Class names of datasets whose labels are not self-explanatory digits.
LABEL_NAMES = {
    "fashion_mnist": ("T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal",
                      "shirt", "sneaker", "bag", "ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                "ship", "truck"),
}
INSTALL_HINT = "pip install 'jsfl[plot]' (or: pip install matplotlib)"


class MissingDependency(ImportError):
  """matplotlib is not installed (the CLI prints the message, exit code 1)."""


def require_matplotlib():
  """matplotlib's ``Figure``, or :class:`MissingDependency` saying how to get it."""
  try:
    from matplotlib.figure import Figure
  except ImportError:
    raise MissingDependency(f"plots need matplotlib, which is not installed: "
                            f"{INSTALL_HINT}") from None
  return Figure


def _figure(kind: str):
  # A bare Figure (no pyplot): no global state, no display backend needed.
  return require_matplotlib()(figsize=SIZES[kind], dpi=DPI, layout="constrained")


def _save(fig, path: str) -> str:
  """Written aside and renamed (:func:`jsfl.rundir.replace_atomic`): a killed
  ``jsfl plot`` leaves the old PNG or the new one, never half of one."""
  rundir.replace_atomic(path, lambda f: fig.savefig(f, dpi=DPI, format="png"), "wb")
  return path


def _colors(n: int):
  from matplotlib import colormaps
  cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "turbo"]
  if n > 20:
    return [cmap(i / max(n - 1, 1)) for i in range(n)]
  return [cmap(i) for i in range(n)]


LEGEND_WIDTH = 60  # characters per legend line; longer labels wrap


def _legend(fig, ax, n: int) -> None:
  """The legend below the axes, never over the data.

  Long labels (many differing config fields) are wrapped so they never run
  off the figure; two columns past 3 entries when the labels are short.
  """
  import textwrap
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    labels = [textwrap.fill(lb, LEGEND_WIDTH) for lb in labels]
    short = max(len(lb) for lb in labels) <= LEGEND_WIDTH
    fig.legend(handles, labels, loc="outside lower center",
               ncols=2 if n > 3 and short else 1, fontsize=8, frameon=False)


def _integer_rounds(ax) -> None:
  from matplotlib.ticker import MaxNLocator
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _by_round(records, key):
  """``{round: [value per seed]}`` of a scalar metric, rounds ascending."""
  out: dict[int, list[float]] = {}
  for r in records:
    v = r.get(key)
    if v is not None and np.isfinite(v):
      out.setdefault(r["round"], []).append(float(v))
  return dict(sorted(out.items()))


def _label_names(group: report.Group, num_labels: int) -> list[str]:
  return dataset_label_names(group.config.get("dataset", {}).get("name", ""), num_labels)


def _ticks(n: int, most: int = 20) -> np.ndarray:
  """At most ``most`` evenly spaced tick positions out of ``range(n)``."""
  step = max(1, int(np.ceil(n / most)))
  return np.arange(0, n, step)


def _legend_label(group: report.Group, groups) -> str:
  return group.label if len(groups) > 1 else (group.label or group.runs[0].name)


def _title_suffix(groups) -> str:
  ds = {g.config.get("dataset", {}).get("name") for g in groups} - {None}
  return f" ({', '.join(sorted(ds))})" if ds else ""


def learning_curves(groups: Sequence[report.Group], path: str) -> str:
  """Accuracy and PG per round: median over seeds, band min..max over seeds."""
  fig = _figure("curves")
  axes = fig.subplots(1, 2)
  colors = _colors(len(groups))
  for ax, (key, ylabel) in zip(axes, (("accuracy", "test accuracy (%)"),
                                      ("pg", "performance gap PG (pp)")), strict=True):
    for g, c in zip(groups, colors, strict=False):
      series = _by_round(g.records(), key)
      if not series:
        continue
      x = np.array(list(series))
      vals = list(series.values())
      med = np.array([np.median(v) for v in vals])
      ax.plot(x, med, color=c, marker="o" if len(x) <= 30 else None, ms=3,
              label=_legend_label(g, groups))
      if max(len(v) for v in vals) > 1:
        ax.fill_between(x, [min(v) for v in vals], [max(v) for v in vals],
                        color=c, alpha=0.2, linewidth=0)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    _integer_rounds(ax)
  seeds = max((len({r["seed"] for r in g.records()}) for g in groups), default=1)
  band = "; band: lowest to highest seed" if seeds > 1 else ""
  axes[0].set_title(f"test accuracy, median over seeds{band}", fontsize=10)
  axes[1].set_title("PG = max - mean per-label accuracy (lower is fairer)", fontsize=10)
  _legend(fig, axes[0], len(groups))
  what = f": {groups[0].label}" if len(groups) == 1 else ""
  fig.suptitle(f"learning curves{what}{_title_suffix(groups)}")
  return _save(fig, path)


def per_label_heatmap(group: report.Group, path: str) -> str | None:
  """Per-label accuracy (rows) over evaluated rounds (columns), median over seeds."""
  by_round: dict[int, list] = {}
  for r in group.records():
    pla = r.get("per_label_accuracy")
    if pla:
      by_round.setdefault(r["round"], []).append(pla)
  widths = {len(p) for v in by_round.values() for p in v}
  if not by_round or len(widths) != 1:
    return None
  rounds = sorted(by_round)
  # null (a non-finite value in the run) becomes NaN and drops out of the median
  grid = np.array([np.nanmedian(np.array([[np.nan if v is None else v for v in p]
                                          for p in by_round[r]], float), axis=0)
                   for r in rounds]).T
  L = grid.shape[0]
  fig = _figure("heatmap")
  ax = fig.subplots()
  im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=100,
                 interpolation="nearest")
  if len(rounds) <= 25 and L <= 15:  # few cells: the numbers themselves fit
    for (i, j), v in np.ndenumerate(grid):
      if np.isnan(v):
        continue
      ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
              color="black" if v > 60 else "white")
  xt = _ticks(len(rounds))
  ax.set_xticks(xt, [str(rounds[i]) for i in xt])
  yt = _ticks(L, 25)
  names = _label_names(group, L)
  ax.set_yticks(yt, [names[i] for i in yt])
  ax.set_xlabel("round")
  ax.set_ylabel("label")
  fig.colorbar(im, ax=ax, label="test accuracy of the label (%)")
  seeds = len({r["seed"] for r in group.records()})
  title = f"per-label accuracy: {group.label}" + (
      f" (median over {seeds} seeds)" if seeds > 1 else "")
  ax.set_title(textwrap.fill(title, 100), fontsize=10)
  return _save(fig, path)


def per_position(groups: Sequence[report.Group], path: str, last: int = 5) -> str | None:
  """Accuracy per position of the label cycle: median over seeds of the
  per-seed median of the last ``last`` evaluated rounds; bars span the seeds."""
  rows = []
  for g in groups:
    per_seed, median = report.per_position_figures(g.records(), last)
    if median is not None:
      rows.append((g, np.stack(list(per_seed.values())), np.asarray(median)))
  if not rows:
    return None
  fig = _figure("per_position")
  ax = fig.subplots()
  colors = _colors(len(rows))
  # Points and lines, not bars: accuracies sit far above 0, and bars cut at a
  # raised baseline would exaggerate differences.  A small x offset per group
  # keeps the seed ranges from hiding each other.
  width = 0.3 / len(rows)
  for i, ((g, seeds, med), c) in enumerate(zip(rows, colors, strict=False)):
    x = np.arange(1, len(med) + 1) + (i - (len(rows) - 1) / 2) * width
    err = np.stack([med - seeds.min(0), seeds.max(0) - med]) if len(seeds) > 1 else None
    ax.errorbar(x, med, yerr=err, color=c, marker="o", ms=4, capsize=3, lw=1.2,
                label=_legend_label(g, [r[0] for r in rows]))
  L = max(len(r[2]) for r in rows)
  ax.set_xticks(_ticks(L) + 1)
  ax.set_xlabel("position in the label cycle (1 = served first in every batch step)")
  ax.set_ylabel("test accuracy of the label (%)")
  ax.grid(alpha=0.3)
  spread = "; error bars: lowest to highest seed" if any(len(r[1]) > 1 for r in rows) else ""
  ax.set_title(f"per-position accuracy, median of the last {last} evaluated rounds{spread}",
               fontsize=10)
  _legend(fig, ax, len(rows))
  return _save(fig, path)


def partition_bars(group: report.Group, path: str) -> str | None:
  """The first seed's partition: per client a bar of label counts, stacked by label."""
  part = next((r.partition for r in group.runs if r.partition), None)
  seeds = (part or {}).get("seeds") or []
  if not seeds or not seeds[0].get("label_counts"):
    return None
  counts = np.asarray(seeds[0]["label_counts"], float)
  if counts.ndim != 2:
    return None
  p = dict(group.config.get("partition", {}))
  desc = p.pop("name", "partition") + "".join(
      f" {k}={v}" for k, v in p.items() if k != "num_clients")
  return label_count_bars(counts, _label_names(group, counts.shape[1]),
                          f"partition: {desc}, {counts.shape[0]} clients "
                          f"(seed {seeds[0].get('seed', 0)})", path)


def _label_colorbar(fig, ax, n: int) -> None:
  """Label index -> colour of :func:`_colors` past 20 labels (a ramp)."""
  from matplotlib import cm, colormaps, colors
  scale = cm.ScalarMappable(norm=colors.Normalize(0, n - 1), cmap=colormaps["turbo"])
  bar = fig.colorbar(scale, ax=ax, pad=0.01, fraction=0.04)
  bar.set_label("label", fontsize=8)
  bar.ax.tick_params(labelsize=8)


def label_count_bars(counts, names: Sequence[str], title: str, path: str) -> str:
  """Per client a bar of its training samples stacked by label (Hydra Fig.
  8); ``counts`` ``(K, L)``: a legend up to 20 labels, past that a colour
  bar of the label index."""
  counts = np.asarray(counts, float)
  K, L = counts.shape
  fig = _figure("partition")
  ax = fig.subplots()
  colors = _colors(L)
  bottom = np.zeros(K)
  x = np.arange(K)
  for label in range(L):
    ax.bar(x, counts[:, label], bottom=bottom, color=colors[label], width=0.85,
           label=names[label])
    bottom += counts[:, label]
  ax.set_xticks(_ticks(K, 30))
  ax.set_xlabel("client")
  ax.set_ylabel("training samples")
  if L <= 20:
    ax.legend(title="label", fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
  else:  # a hundred legend entries would not fit: the colours' ramp, by label index
    _label_colorbar(fig, ax, L)
  ax.set_title(title, fontsize=10)
  return _save(fig, path)


def dataset_label_names(dataset: str, num_labels: int) -> list[str]:
  """``"<i> <name>"`` where jsfl knows the dataset's class names, else ``"<i>"``."""
  names = LABEL_NAMES.get(dataset)
  if names and len(names) == num_labels:
    return [f"{i} {n}" for i, n in enumerate(names)]
  return [str(i) for i in range(num_labels)]


def accuracy_vs_communication(groups: Sequence[report.Group], path: str) -> str | None:
  """Test accuracy against cumulative bytes up + down, median over seeds."""
  lines = []
  for g in groups:
    pts: dict[int, list[tuple[float, float]]] = {}
    for r in g.records():
      up, down, acc = r.get("bytes_up_total"), r.get("bytes_down_total"), r.get("accuracy")
      if up is not None and down is not None and acc is not None:
        pts.setdefault(r["round"], []).append((up + down, acc))
    if pts:
      xs = np.array([np.median([b for b, _ in v]) for _, v in sorted(pts.items())])
      ys = np.array([np.median([a for _, a in v]) for _, v in sorted(pts.items())])
      lines.append((g, xs, ys))
  if not lines:
    return None
  top = max(float(xs.max()) for _, xs, _ in lines)
  unit, scale = next(((u, s) for u, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6),
                                            ("kB", 1e3)) if top >= s), ("bytes", 1.0))
  fig = _figure("communication")
  ax = fig.subplots()
  for (g, xs, ys), c in zip(lines, _colors(len(lines)), strict=True):
    ax.plot(xs / scale, ys, color=c, marker="o" if len(xs) <= 30 else None, ms=3,
            label=_legend_label(g, [ln[0] for ln in lines]))
  lo = min(float(xs.min()) for _, xs, _ in lines if xs.min() > 0) if top > 0 else 0
  if lo > 0 and top / lo > 100:  # methods orders of magnitude apart (FedAvg vs SFL)
    from matplotlib.ticker import FuncFormatter
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
  ax.set_xlabel(f"cumulative communication, bytes up + down ({unit})")
  ax.set_ylabel("test accuracy (%)")
  ax.grid(alpha=0.3)
  ax.set_title("accuracy against communication (median over seeds)"
               + (", log scale" if ax.get_xscale() == "log" else ""), fontsize=10)
  _legend(fig, ax, len(lines))
  return _save(fig, path)


def read_step_confusion(run_dir: str) -> dict | None:
  """``confusion_steps.npz`` of a run directory as arrays; None when it is
  missing or unreadable."""
  path = os.path.join(run_dir, STEP_CONFUSION)
  if not os.path.isfile(path):
    return None
  try:
    with np.load(path) as f:
      out = {k: f[k] for k in ("round", "confusion", "labels", "steps", "seed")}
  except (OSError, ValueError, KeyError):
    return None
  return out if out["confusion"].ndim == 5 and len(out["round"]) else None


def _first_step_confusion(group: report.Group):
  """``(run, arrays)`` of the group's first run with ``confusion_steps.npz``."""
  return next(((run, d) for run in group.runs
               if (d := read_step_confusion(run.path)) is not None), None)


def step_confusion(group: report.Group, path: str) -> str | None:
  """The confusion matrices after each step of a cyclic round (Hydra Fig.
  11): the group's first run with ``confusion_steps.npz``, its last recorded
  round and first seed; a row of heatmaps of the first
  :data:`MAX_STEP_PANELS` steps, each row (true label) as percentages of its
  test samples."""
  found = _first_step_confusion(group)
  if found is None:
    return None
  run, d = found
  count = int(d["steps"][-1, 0])
  if count == 0:
    return None
  mats = d["confusion"][-1, 0, :min(count, MAX_STEP_PANELS)].astype(float)
  labels = d["labels"][-1, 0]
  L = mats.shape[-1]
  names = _label_names(group, L)
  share = 100.0 * mats / np.maximum(mats.sum(-1, keepdims=True), 1.0)
  fig = _figure("step_confusion")
  axes = np.atleast_1d(fig.subplots(1, len(share), sharey=True))
  im = None
  for s, (ax, m) in enumerate(zip(axes, share, strict=True)):
    im = ax.imshow(m, cmap="viridis", vmin=0, vmax=100, interpolation="nearest")
    ax.set_title(f"step {s + 1}: {names[int(labels[s])]}", fontsize=8)
    ticks = _ticks(L, 10)
    ax.set_xticks(ticks, [str(i) for i in ticks], fontsize=7)
    ax.set_yticks(ticks, [str(i) for i in ticks], fontsize=7)
    ax.set_xlabel("predicted", fontsize=8)
  axes[0].set_ylabel("true label", fontsize=8)
  fig.colorbar(im, ax=list(axes), label="% of the true label's test samples",
               shrink=0.8)
  more = f", first {len(share)} of {count}" if count > len(share) else ""
  title = (f"confusion after each step of round {int(d['round'][-1])} "
           f"(seed {int(d['seed'][0])}{more}): {group.label or run.name}")
  fig.suptitle(textwrap.fill(title, 150), fontsize=10)
  return _save(fig, path)


def step_accuracy(group: report.Group, path: str) -> str | None:
  """Per-class test accuracy after each recorded step (SFedKD Fig. 1 (a),
  (b)): the group's first run with ``confusion_steps.npz``, its first seed,
  the recorded rounds' steps in order, a line per class, round boundaries
  dotted; the title gives the forgetting measure over the whole sequence
  (BW with the steps as rows, :func:`jsfl.statistics.backward_transfer`),
  with its median and range over the run's seeds when it has several."""
  found = _first_step_confusion(group)
  if found is None:
    return None
  run, d = found
  counts = [int(c) for c in d["steps"][:, 0]]
  accs = [statistics.step_class_accuracy(d["confusion"], d["steps"], s)
          for s in range(d["confusion"].shape[1])]
  acc = accs[0]
  if len(acc) < 2:
    return None
  L = acc.shape[1]
  names = _label_names(group, L)
  fig = _figure("step_accuracy")
  ax = fig.add_subplot(1, 1, 1)
  x = np.arange(1, len(acc) + 1)
  for c in range(L):
    ax.plot(x, acc[:, c], lw=1.0, label=names[c])
  for b in np.cumsum(counts)[:-1]:
    ax.axvline(b + 0.5, color="0.6", ls=":", lw=0.8)
  ax.set_xlabel("step (a sequential method: one client's training)")
  ax.set_ylabel("test accuracy of the class (%)")
  ax.set_ylim(0, 100)
  if L <= 20:  # a hundred classes' names would bury the lines
    _legend(fig, ax, L)
  rounds = ", ".join(str(int(r)) for r in d["round"])
  bw = [statistics.backward_transfer(a) for a in accs]
  forgetting = f"forgetting measure {bw[0]:.2f}"
  per_seed = [b for b in bw if b is not None]
  if len(per_seed) > 1:  # one seed's curves; the measure as the report gives figures
    forgetting += (f", median over its {len(per_seed)} seeds {np.median(per_seed):.2f} "
                   f"[{min(per_seed):.2f}, {max(per_seed):.2f}]")
  title = (f"per-class accuracy after each step of rounds {rounds} (seed "
           f"{int(d['seed'][0])}; {forgetting}): {group.label or run.name}")
  ax.set_title(textwrap.fill(title, 110), fontsize=9)
  return _save(fig, path)


def plot_groups(groups: Sequence[report.Group], out_dir: str, last: int = 5) -> list[str]:
  """Writes every plot that applies to ``groups`` into ``out_dir``.

  Returns:
    The PNG paths written, in a stable order.
  """
  if not groups:
    return []
  require_matplotlib()  # fail before any directory is made
  os.makedirs(out_dir, exist_ok=True)
  out: list[str | None] = [learning_curves(groups, os.path.join(out_dir, "curves.png"))]
  for g in groups:
    out.append(per_label_heatmap(g, os.path.join(out_dir, f"heatmap_{g.slug}.png")))
  out.append(per_position(groups, os.path.join(out_dir, "per_position.png"), last))
  seen: set[str] = set()
  for g in groups:  # one plot per distinct partition, not per method
    key = repr((g.config.get("dataset"), g.config.get("partition"),
                g.runs[0].config.get("run", {}).get("seed")))
    if key not in seen:
      seen.add(key)
      out.append(partition_bars(g, os.path.join(out_dir, f"partition_{g.slug}.png")))
  out.append(accuracy_vs_communication(
      groups, os.path.join(out_dir, "accuracy_vs_communication.png")))
  out.append(landscapes(groups, os.path.join(out_dir, "landscape.png")))
  for g in groups:
    out.append(step_confusion(g, os.path.join(out_dir, f"confusion_steps_{g.slug}.png")))
    out.append(step_accuracy(g, os.path.join(out_dir, f"classwise_steps_{g.slug}.png")))
  return [p for p in out if p]


def plot_runs(paths: Sequence[str], out_dir: str, by: Sequence[str] | None = None,
              last: int = 5, strict_by: bool = False) -> tuple[list[str], list[str]]:
  """Finds the runs under ``paths`` and plots them.

  Returns:
    ``(png_paths, problems)``, problems as in :func:`jsfl.report.build_report`
    (``strict_by`` too: a ``by`` field no run has raises
    :class:`jsfl.report.rows.UnknownField`).
  """
  groups, problems = report.load_groups(paths, by, strict_by)
  return plot_groups(groups, out_dir, last), problems


def read_landscape(path: str) -> dict:
  """A ``jsfl landscape`` file with ``loss`` and ``accuracy`` as float arrays
  (``null``, a non-finite value, as NaN).

  Raises:
    ValueError: not such a file.
  """
  with open(path) as f:
    obj = json.load(f)
  try:
    for k in ("x", "y", "loss", "accuracy"):
      obj[k] = np.asarray([np.nan if v is None else v for v in obj[k]] if k in ("x", "y") else
                          [[np.nan if v is None else v for v in row] for row in obj[k]], float)
    ok = obj["loss"].shape == obj["accuracy"].shape == (len(obj["y"]), len(obj["x"]))
  except (KeyError, TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"{path}: not a jsfl landscape file (x, y, loss, accuracy)")
  return obj


def landscape_files(run_dir: str) -> list[str]:
  """``RUN_DIR/landscape/landscape-seed<S>.json``, by seed."""
  found = glob.glob(os.path.join(glob.escape(run_dir), "landscape", "landscape-seed*.json"))
  seed = lambda p: int(m.group(1)) if (m := re.search(r"seed(-?\d+)\.json$", p)) else 0
  return sorted(found, key=seed)


def _loss_levels(*losses: np.ndarray, n: int = 16) -> np.ndarray:
  """Contour levels over every finite loss: log-spaced when they span more
  than a decade (a landscape's walls rise fast away from its valley)."""
  vals = np.concatenate([v[np.isfinite(v)].ravel() for v in losses])
  if not vals.size:  # every point non-finite: levels for an empty plot
    return np.linspace(0.0, 1.0, n)
  lo, hi = float(vals.min()), float(vals.max())
  if hi <= lo:
    hi = lo + 1e-6
  if lo > 0 and hi / lo > 10:
    return np.geomspace(lo, hi, n)
  return np.linspace(lo, hi, n)


def _contours(ax, obj: dict, key: str, levels, cmap: str):
  """Filled contours of ``obj[key]`` over the grid, lines between them, the
  trained model a star at the origin; log colours for loss levels that are."""
  norm = None
  if key == "loss" and levels[0] > 0 and levels[-1] / levels[0] > 10:
    from matplotlib.colors import LogNorm
    norm = LogNorm(levels[0], levels[-1])
  z = np.ma.masked_invalid(obj[key])
  cs = ax.contourf(obj["x"], obj["y"], z, levels=levels, cmap=cmap, norm=norm)
  ax.contour(obj["x"], obj["y"], z, levels=levels, colors="k", linewidths=0.4, alpha=0.5)
  ax.plot([0], [0], marker="*", color="white", markeredgecolor="black", ms=11)
  ax.set_aspect("equal")
  ax.set_xlabel("direction 1 (alpha)")
  return cs


def _centre(obj: dict, key: str, fmt: str) -> str:
  v = (obj.get("center") or {}).get(key)
  return format(v, fmt) if isinstance(v, (int, float)) else "-"


def _landscape_what(obj: dict) -> str:
  o = obj.get("options", {})
  return (f"{o.get('data', '?')} loss, {o.get('samples', '?')} samples, "
          f"round {obj.get('round', '?')}")


def landscape_contour(path: str, out: str) -> str:
  """One ``jsfl landscape`` file as two filled contour plots, the loss (log
  levels when it spans more than a decade) and the accuracy, the trained
  model a star at the centre."""
  obj = read_landscape(path)
  fig = _figure("landscape")
  ax_loss, ax_acc = fig.subplots(1, 2)
  cs = _contours(ax_loss, obj, "loss", _loss_levels(obj["loss"]), "viridis")
  fig.colorbar(cs, ax=ax_loss, label="cross-entropy", shrink=0.9)
  acc = obj["accuracy"][np.isfinite(obj["accuracy"])]
  lo, hi = (float(acc.min()), float(acc.max())) if acc.size else (0.0, 100.0)
  cs = _contours(ax_acc, obj, "accuracy", np.linspace(lo, max(hi, lo + 1e-6), 16), "magma")
  fig.colorbar(cs, ax=ax_acc, label="accuracy (%)", shrink=0.9)
  for ax in (ax_loss, ax_acc):
    ax.set_ylabel("direction 2 (beta)")
  ax_loss.set_title(f"loss (centre {_centre(obj, 'loss', '.4g')})", fontsize=10)
  ax_acc.set_title(f"accuracy (centre {_centre(obj, 'accuracy', '.2f')}%)", fontsize=10)
  fig.suptitle(f"loss landscape: {obj.get('method', '?')}, {obj.get('model', '?')}, "
               f"{obj.get('dataset', '?')}, seed {obj.get('seed', '?')} "
               f"({_landscape_what(obj)}; filter-normalised directions)")
  return _save(fig, out)


def landscapes(groups: Sequence[report.Group], path: str) -> str | None:
  """The loss contours of every group with a ``jsfl landscape`` file (its
  first run's lowest seed), side by side on shared levels; None without
  any."""
  found = []
  for g in groups:
    for run in g.runs:
      files = landscape_files(run.path)
      if files:
        try:
          found.append((g, read_landscape(files[0])))
        except (OSError, ValueError):
          continue
        break
  if not found:
    return None
  fig = _figure("landscapes")
  axs = np.atleast_1d(fig.subplots(1, len(found)))
  levels = _loss_levels(*(obj["loss"] for _, obj in found))
  for ax, (g, obj) in zip(axs, found, strict=True):
    cs = _contours(ax, obj, "loss", levels, "viridis")
    ax.set_title(textwrap.fill(_legend_label(g, groups), 40)
                 + f"\ncentre loss {_centre(obj, 'loss', '.4g')}", fontsize=9)
  axs[0].set_ylabel("direction 2 (beta)")
  fig.colorbar(cs, ax=list(axs), label="cross-entropy", shrink=0.9)
  fig.suptitle(f"loss landscapes ({_landscape_what(found[0][1])}; seed "
               f"{found[0][1].get('seed', '?')}; filter-normalised directions)"
               f"{_title_suffix(groups)}")
  return _save(fig, path)
