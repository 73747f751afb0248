"""``jsfl plot``: every plot is written, non-empty, of its fixed size."""

import os
import shutil
import struct
import sys

import numpy as np
import pytest
from test_report import CORE_RUNS, make_records, write_run

from jsfl import cli, plots

matplotlib = pytest.importorskip("matplotlib")


def png_size(path):
  """(width, height) from a PNG's IHDR chunk."""
  with open(path, "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
  return struct.unpack(">II", head[16:24])


def expected_size(kind):
  w, h = plots.SIZES[kind]
  return round(w * plots.DPI), round(h * plots.DPI)


def check_png(path, kind):
  assert os.path.getsize(path) > 5000, f"{path} is nearly empty"
  assert png_size(path) == expected_size(kind)
  from matplotlib.image import imread
  img = imread(path)
  # something was drawn: many distinct colours, not a blank canvas
  assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20


def test_every_plot_of_a_small_cyclic_run(tmp_path):
  run = write_run(tmp_path / "run")
  pngs, problems = plots.plot_runs([run], str(tmp_path / "plots"))
  assert problems == []
  names = [os.path.basename(p) for p in pngs]
  assert names == ["curves.png", "heatmap_sfl.png", "per_position.png", "partition_sfl.png",
                   "accuracy_vs_communication.png"]
  kinds = ["curves", "heatmap", "per_position", "partition", "communication"]
  for p, kind in zip(pngs, kinds):
    check_png(p, kind)


def test_many_groups_one_plot_each_where_per_group(tmp_path):
  write_run(tmp_path / "s" / "a")
  write_run(tmp_path / "s" / "b", {"method.name": "fedavg"},
            records=make_records(method="fedavg", cyclic=False))
  pngs, _ = plots.plot_runs([str(tmp_path / "s")], str(tmp_path / "plots"))
  names = sorted(os.path.basename(p) for p in pngs)
  # one partition plot: both runs share it; per_position only from the cyclic run
  assert names == ["accuracy_vs_communication.png", "curves.png", "heatmap_01_sfl.png",
                   "heatmap_02_fedavg.png", "partition_01_sfl.png", "per_position.png"]
  for p in pngs:
    assert png_size(p) in {expected_size(k) for k in plots.SIZES}


def test_no_per_position_plot_without_a_cyclic_order(tmp_path):
  run = write_run(tmp_path / "run", records=make_records(cyclic=False))
  pngs, _ = plots.plot_runs([run], str(tmp_path / "plots"))
  assert "per_position.png" not in [os.path.basename(p) for p in pngs]


def test_plots_of_a_real_run(tmp_path):
  # Runner output (Fashion-MNIST, 2 seeds, cyclic 80%-DL): class names, 10 labels.
  if not os.path.isdir(CORE_RUNS):
    pytest.skip("experiments/core/results/core not present")
  run = os.path.join(CORE_RUNS, min(d for d in os.listdir(CORE_RUNS) if "cyclic" in d))
  pngs, problems = plots.plot_runs([run], str(tmp_path / "plots"))
  assert problems == [] and len(pngs) == 5
  for p in pngs:
    assert png_size(p) in {expected_size(k) for k in plots.SIZES}


def test_cli_plot_defaults_to_run_dir_plots(tmp_path, capsys):
  run = write_run(tmp_path / "run")
  assert cli.main(["plot", run]) == 0
  out = capsys.readouterr().out.split()
  assert out[0] == os.path.join(run, "plots", "curves.png")
  assert all(os.path.exists(p) for p in out)
  # a run's metrics file stands for its directory, as in jsfl report
  shutil.rmtree(os.path.join(run, "plots"))
  assert cli.main(["plot", os.path.join(run, "metrics.jsonl")]) == 0
  assert capsys.readouterr().out.split() == out


def test_cli_plot_without_runs_is_an_error(tmp_path, capsys):
  assert cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "p")]) == 2
  assert "no run with a usable metrics.jsonl" in capsys.readouterr().err


def test_missing_matplotlib_is_one_clear_message(tmp_path, capsys, monkeypatch):
  run = write_run(tmp_path / "run")
  # None in sys.modules makes `import matplotlib.figure` raise ImportError.
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  code = cli.main(["plot", run, "--out", str(tmp_path / "p")])
  err = capsys.readouterr().err
  assert code == 1
  assert err.strip() == ("jsfl: error: plots need matplotlib, which is not installed: "
                         "pip install 'jsfl[plot]' (or: pip install matplotlib)")
  assert not os.path.exists(tmp_path / "p")


@pytest.mark.parametrize("labels,legend", [(10, True), (100, False)])
def test_label_count_bars_name_every_label(tmp_path, monkeypatch, labels, legend):
  """Up to 20 labels a legend names each colour; past that (CIFAR-100,
  FEMNIST) a colour bar maps the label index to the colour ramp."""
  figs = []
  save = plots._save
  monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or save(fig, path))
  counts = np.random.default_rng(0).integers(0, 30, (12, labels))
  path = plots.label_count_bars(counts, [str(i) for i in range(labels)], "t",
                                str(tmp_path / "p.png"))
  check_png(path, "partition")
  (fig,) = figs
  bars = fig.axes[0]
  assert (bars.get_legend() is not None) is legend
  assert len(fig.axes) == (1 if legend else 2)  # the colour bar's own axes
  if not legend:
    assert fig.axes[1].get_ylim() == (0, labels - 1)
