"""``jsfl report``: numbers against hand-made run directories, grouping, damage."""

import copy
import csv
import gzip
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jsfl import cli, reading, report, statistics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the committed cells of experiments/core/core.toml, one run directory each
CORE_RUNS = os.path.join(REPO, "experiments", "core", "results", "core")

BASE_CONFIG = {
    "run": {"name": "t", "out_dir": "runs", "dir": "", "rounds": 7, "eval_every": 1,
            "seeds": 2, "seed": 0},
    "dataset": {"name": "synthetic", "data_dir": "", "download": True},
    "partition": {"name": "dominant_label", "num_clients": 4, "p": 0.8},
    "model": {"name": "small_cnn", "cut": -1, "norm": "", "conv_impl": "auto",
              "depthwise_impl": "auto"},
    "method": {"name": "sfl", "order": "cyclic", "clients_per_round": 0, "local_epochs": 1,
               "batch_size": 64},
    "optim": {"lr": 0.05, "lr_decay": 1.0, "lr_min": 0.0, "momentum": 0.0,
              "weight_decay": 0.0},
    "exec": {"client_exec": "vmap", "seed_exec": "map", "server_unroll": 1,
             "eval_batch": 1000, "progress": False},
}
# Per seed: accuracy, PG and BW over 7 evaluated rounds.  By hand, the median
# of the last 5 rounds is 50 / 55 (accuracy), 5 / 2 (PG), 4 / 0 (BW), so the
# table reads 52.50 +- 2.50, 3.50 +- 1.50, 2.00 +- 2.00.
SERIES = {
    0: {"accuracy": [10, 20, 30, 40, 50, 60, 70], "pg": [9, 8, 7, 6, 5, 4, 3],
        "bw": [None, 1, 2, 3, 4, 5, 6]},
    1: {"accuracy": [15, 25, 35, 45, 55, 65, 95], "pg": [1, 1, 1, 1, 2, 2, 9],
        "bw": [None, 0, 0, 0, 0, 0, 10]},
}


def make_records(series=SERIES, num_labels=4, method="sfl", cyclic=True):
  """One record per round and seed, shaped like a run's (``train.records``)."""
  recs = []
  rounds = len(next(iter(series.values()))["accuracy"])
  for r in range(rounds):
    for seed, s in series.items():
      acc = float(s["accuracy"][r])
      pla = [min(100.0, acc + 10.0 * i) for i in range(num_labels)]
      rec = {"round": r + 1, "seed": seed, "method": method, "accuracy": acc,
             "loss": 1.0 / (r + 1), "per_label_accuracy": pla, "pg": s["pg"][r],
             "bw": s["bw"][r], "train_loss": 0.5, "bytes_up": 100, "bytes_down": 50,
             "bytes_up_total": 100 * (r + 1), "bytes_down_total": 50 * (r + 1),
             "samples": 400, "wall_s": 0.1, "lr": 0.05, "clients": list(range(num_labels))}
      if cyclic:
        order = list(range(num_labels))[::-1]
        rec["label_order"] = order
        rec["per_position_accuracy"] = [pla[label] for label in order]
      recs.append(rec)
  return recs


def write_run(path, config_changes=None, records=None, num_labels=4, raw_lines=None,
              summary=True):
  """A hand-made run directory following docs/run-directory.md.

  Args:
    path: the directory (created).
    config_changes: ``{"section.key": value}`` applied to BASE_CONFIG.
    records: metrics records (default: :func:`make_records`).
    num_labels: labels of the partition and the records.
    raw_lines: metrics.jsonl lines as text, written instead of ``records``.
    summary: write summary.json (as a run does) from ``records``.
  """
  os.makedirs(path, exist_ok=True)
  cfg = copy.deepcopy(BASE_CONFIG)
  for key, value in (config_changes or {}).items():
    section, field = key.split(".")
    cfg[section][field] = value
  if records is None:
    records = make_records(num_labels=num_labels, method=cfg["method"]["name"])
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"config": cfg, "versions": {"jsfl": "0.1.0"}, "device": "cpu:cpu x1",
               "resolved": {"cut": 2, "seeds": [0, 1]}}, f)
  K = cfg["partition"]["num_clients"]
  counts = [[(50 if label == c % num_labels else 5) for label in range(num_labels)]
            for c in range(K)]
  with open(os.path.join(path, "partition.json"), "w") as f:
    json.dump({"seeds": [{"seed": s, "label_counts": counts,
                          "sizes": [sum(row) for row in counts],
                          "dominant": [c % num_labels for c in range(K)]} for s in (0, 1)]}, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    if raw_lines is not None:
      f.write("".join(raw_lines))
    else:
      f.writelines(json.dumps(r) + "\n" for r in records)
  if summary:
    with open(os.path.join(path, "summary.json"), "w") as f:
      json.dump({"method": cfg["method"]["name"], "rounds_evaluated": 7, "seeds": [0, 1],
                 **statistics.summarize(records)}, f)
  return str(path)


def test_numbers_of_one_run_follow_the_papers_statistic(tmp_path):
  run = write_run(tmp_path / "run")
  rep = report.build_report([run])
  assert rep.problems == [] and len(rep.rows) == 1
  row = rep.rows[0]
  assert row.seeds == 2 and row.rounds == "7"
  assert row.stats["accuracy"]["median"] == pytest.approx(52.5)
  assert row.stats["accuracy"]["std"] == pytest.approx(2.5)
  assert row.stats["pg"]["median"] == pytest.approx(3.5)
  assert row.stats["pg"]["std"] == pytest.approx(1.5)
  assert row.stats["bw"]["median"] == pytest.approx(2.0)
  assert row.stats["bw"]["std"] == pytest.approx(2.0)
  assert row.bytes_total == pytest.approx(7 * 150)
  # per position: labels reversed, per-label accuracy = accuracy + 10 * label
  assert row.per_position == pytest.approx([82.5, 72.5, 62.5, 52.5])
  md = report.to_markdown(rep)
  assert "| sfl | 2 | 7 | 52.50 +- 2.50 | 3.50 +- 1.50 | 2.00 +- 2.00 | 1.05 kB |" in md
  assert "| sfl | 82.5 | 72.5 | 62.5 | 52.5 |" in md


def test_csv_files_hold_the_same_numbers(tmp_path):
  rep = report.build_report([write_run(tmp_path / "run")])
  paths = report.write_report(rep, str(tmp_path / "out"))
  assert [os.path.basename(p) for p in paths] == ["report.md", "report.csv",
                                                  "report_seeds.csv"]
  with open(paths[1]) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 1
  assert float(rows[0]["accuracy_median"]) == pytest.approx(52.5)
  assert float(rows[0]["accuracy_std"]) == pytest.approx(2.5)
  assert float(rows[0]["bw_median"]) == pytest.approx(2.0)
  assert rows[0]["method.name"] == "sfl" and rows[0]["seeds"] == "2"
  with open(paths[2]) as f:
    seeds = list(csv.DictReader(f))
  assert [(r["seed"], float(r["accuracy"]), float(r["pg"])) for r in seeds] == \
      [("0", 50.0, 5.0), ("1", 55.0, 2.0)]


def test_the_training_summary_gives_the_papers_figures():
  """``jsfl.metrics.summarize`` (what a run's ``summary.json`` holds) on the
  hand-made records: per seed the median of the last 5 evaluated rounds,
  then the median and population std over the seeds, worked by hand (7
  rounds; the loss 1 / round gives 1/5 for every seed)."""
  from jsfl import metrics  # imports jax
  recs = make_records()
  got = metrics.summarize(recs)
  for k, per_seed, median, std in (("accuracy", [50.0, 55.0], 52.5, 2.5),
                                   ("pg", [5.0, 2.0], 3.5, 1.5),
                                   ("bw", [4.0, 0.0], 2.0, 2.0),
                                   ("loss", [0.2, 0.2], 0.2, 0.0)):
    assert got[k]["seeds"] == [0, 1] and got[k]["per_seed"] == pytest.approx(per_seed), k
    assert (got[k]["median"], got[k]["std"]) == pytest.approx((median, std)), k
  with pytest.raises(ValueError, match="appears twice"):
    statistics.summarize(recs + recs[:1])


def test_runs_are_grouped_by_the_fields_that_differ_and_seeds_are_pooled(tmp_path):
  # Two invocations of the same sfl config with different seeds (a split
  # sweep) pool into one row; fedavg is another row.  run.name, out_dir and
  # exec.* say where and how a run ran, so they never split rows.
  write_run(tmp_path / "sweep" / "a", {"run.name": "a"})
  write_run(tmp_path / "sweep" / "b", {"run.name": "b", "run.seed": 2,
                                       "exec.client_exec": "map"},
            records=make_records({2: SERIES[0], 3: SERIES[1]}))
  write_run(tmp_path / "sweep" / "c", {"method.name": "fedavg"})
  rep = report.build_report([str(tmp_path / "sweep")])
  assert rep.problems == []
  assert rep.columns == ["method.name"]
  assert [(r.group.values["method.name"], r.seeds) for r in rep.rows] == \
      [("sfl", 4), ("fedavg", 2)]
  sfl = rep.rows[0]
  # per seed 50, 55, 50, 55 -> median 52.5, std 2.5
  assert sfl.stats["accuracy"]["median"] == pytest.approx(52.5)
  assert sfl.stats["accuracy"]["std"] == pytest.approx(2.5)
  assert len(sfl.group.runs) == 2
  assert rep.shared["partition.name"] == "dominant_label"
  assert "run.name" not in rep.shared and "exec.client_exec" not in rep.shared


def test_bfloat16_runs_are_their_own_rows(tmp_path):
  """exec.precision changes what a run computes: bfloat16 runs are a row of
  their own, float32 ones pool with runs from before the key existed."""
  write_run(tmp_path / "old", {"run.name": "old"})
  write_run(tmp_path / "f32", {"exec.precision": "float32", "run.seed": 2},
            records=make_records({2: SERIES[0], 3: SERIES[1]}))
  write_run(tmp_path / "bf16", {"exec.precision": "bfloat16"})
  rep = report.build_report([str(tmp_path)])
  assert rep.columns == ["method.name", "exec.precision"]
  assert sorted((r.group.values.get("exec.precision"), r.seeds) for r in rep.rows) == \
      [("-", 4), ("bfloat16", 2)]


def test_varying_fields_become_columns_partition_options_beside_partition(tmp_path, capsys):
  write_run(tmp_path / "r1", {"method.order": "random", "partition.p": 0.6})
  write_run(tmp_path / "r2", {"method.order": "cyclic", "partition.p": 0.8})
  write_run(tmp_path / "r3", {"method.name": "hydra", "method.groups": 2})
  rep = report.build_report([str(tmp_path)])
  assert rep.columns == ["method.name", "method.order", "method.groups", "partition.p"]
  md = report.to_markdown(rep)
  # Hydra alone has groups: named once, not a column of "-"; the order
  # varies within SFL, so it stays a column ("-" where a run lacks a field)
  assert rep.fixed == ["method.groups"]
  assert "Options their method fixes: hydra: groups=2." in md
  assert "| method | order | p | seeds |" in md
  assert "| hydra | cyclic | 0.8 |" in md
  assert "| sfl | random | 0.6 |" in md
  assert [r.group.label for r in rep.rows] == ["sfl, order=random, p=0.6",
                                               "sfl, order=cyclic, p=0.8",
                                               "hydra, order=cyclic, p=0.8"]
  report.write_csv(rep, str(tmp_path / "r.csv"))  # the CSV keeps every column
  with open(tmp_path / "r.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["method.groups"] for r in rows] == ["-", "-", "2"]
  # an explicit grouping pools everything else, and shows every field it names
  rep = report.build_report([str(tmp_path)], by=["method.name"])
  assert [r.seeds for r in rep.rows] == [4, 2] and rep.problems == []
  rep = report.build_report([str(tmp_path)], by=["method.name", "method.groups"])
  assert rep.fixed == [] and "| method | groups | seeds |" in report.to_markdown(rep)
  assert [r.group.label for r in rep.rows] == ["sfl", "hydra, groups=2"]
  # a sweep's field whose cells have not started is a note; a command line's
  # (strict_by) is a typo: one line, exit 2, nothing written
  rep = report.build_report([str(tmp_path)], by=["method.nmae"])
  assert rep.problems == [("--by method.nmae: no run has this config field (allowed: "
                           "section.key, e.g. method.name)")]
  with pytest.raises(report.UnknownField, match="--by method.nmae: .*; allowed: "):
    report.build_report([str(tmp_path)], by=["method.nmae"], strict_by=True)
  before = sorted(os.listdir(tmp_path))
  for argv in (["report", str(tmp_path), "--by", "method.nmae", "--out", str(tmp_path / "o")],
               ["plot", str(tmp_path), "--by", "method.nmae"]):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["jsfl: error: --by method.nmae: no run has this config "
                                "field; allowed: a section.key of the runs' config, e.g. "
                                "method.name"], err
  assert sorted(os.listdir(tmp_path)) == before


def test_partition_seed_is_never_titled_as_the_runs_seed():
  from jsfl.report.groups import short_names
  assert short_names(["partition.seed", "partition.p", "method.name"]) == {
      "partition.seed": "partition.seed", "partition.p": "p", "method.name": "method"}


def test_model_cut_is_compared_resolved(tmp_path):
  # cut = -1 means the model's default (resolved 2): the same experiment as cut = 2.
  write_run(tmp_path / "a", {"model.cut": -1})
  write_run(tmp_path / "b", {"model.cut": 2})
  rep = report.build_report([str(tmp_path)])
  assert len(rep.rows) == 1 and rep.rows[0].seeds == 4
  assert rep.shared["model.cut"] == 2


def test_tree_search_finds_nested_runs_and_names_what_it_cannot_use(tmp_path):
  write_run(tmp_path / "sweep" / "x" / "run1")
  write_run(tmp_path / "sweep" / "y" / "z" / "run2", {"method.name": "fedavg"})
  os.makedirs(tmp_path / "sweep" / "notes")
  os.makedirs(tmp_path / "empty")
  dirs, problems = reading.find_run_dirs([str(tmp_path / "sweep"),
                                         str(tmp_path / "sweep" / "x" / "run1"),
                                         str(tmp_path / "empty"), str(tmp_path / "nope")])
  assert [os.path.relpath(d, tmp_path) for d in dirs] == ["sweep/x/run1", "sweep/y/z/run2"]
  assert problems == [f"{tmp_path / 'empty'}: no run directory (no metrics.jsonl) in it",
                      f"{tmp_path / 'nope'}: no such directory"]
  # a metrics.jsonl path stands for its run
  assert reading.find_run_dirs([str(tmp_path / "sweep/x/run1/metrics.jsonl")])[0] == \
      [str(tmp_path / "sweep/x/run1")]


def test_damaged_metrics_lines_are_named_and_the_rest_is_reported(tmp_path):
  good = make_records()
  lines = [json.dumps(r) + "\n" for r in good]
  damaged = (lines[:2]
             + ['{"round": 3, "seed": 0, "accuracy": \n']        # line 3: broken JSON
             + lines[2:4]
             + [json.dumps({"round": 9, "accuracy": 99.0}) + "\n"]   # line 6: no seed
             + [json.dumps({**good[0], "round": 8, "accuracy": "high"}) + "\n"]  # line 7
             + [lines[0]]                                          # line 8: repeat
             + ["\n"]                                              # blank: ignored
             + lines[4:]
             + ['{"round": 8, "seed": 1, "accur'])                 # last: half-written
  run = write_run(tmp_path / "run", raw_lines=damaged, summary=False)
  mpath = os.path.join(run, "metrics.jsonl")
  rep = report.build_report([run])
  last = 9 + len(lines) - 4 + 1
  assert rep.problems == [
      f"{mpath}:3: not valid JSON (Expecting value); line skipped",
      f"{mpath}:6: no 'seed' key; line skipped",
      f"{mpath}:7: accuracy='high' is not a number; line skipped",
      f"{mpath}:8: seed 0 round 1 already read at line 1; line skipped",
      f"{mpath}:{last}: not valid JSON (Unterminated string starting at); line skipped",
  ]
  # every good line survived: the figures are the clean ones
  row = rep.rows[0]
  assert row.stats["accuracy"]["median"] == pytest.approx(52.5)
  assert row.stats["bw"]["median"] == pytest.approx(2.0)
  md = report.to_markdown(rep)
  assert "## Skipped" in md and f"{mpath}:3:" in md


def test_hand_edited_values_neither_crash_the_report_nor_count(tmp_path):
  recs = make_records()
  # a seed that is not an int is a skipped line, not a TypeError in sorting seeds
  lines = [json.dumps(r) + "\n" for r in recs] + [json.dumps({**recs[0], "seed": "7"}) + "\n"]
  run = write_run(tmp_path / "a", raw_lines=lines, summary=False)
  rep = report.build_report([run])
  assert rep.problems == [f"{os.path.join(run, 'metrics.jsonl')}:{len(lines)}: seed='7' "
                          "is not an int; line skipped"]
  assert rep.rows[0].seeds == 2
  # Infinity (valid to Python's json) is skipped like NaN: three seeds, two figures
  inf = [{"seed": s, "round": 1, "accuracy": a} for s, a in enumerate([10.0, 20.0, math.inf])]
  assert statistics.per_seed_figures(inf, "accuracy") == {0: 10.0, 1: 20.0}
  assert statistics.summarize(inf, ("accuracy",))["accuracy"]["std"] == pytest.approx(5.0)
  # last = 0 would have been every round (v[-0:])
  with pytest.raises(ValueError, match=r"last=0; allowed: an int >= 1"):
    report.build_report([run], last=0)
  with pytest.raises(ValueError, match=r"last=0; allowed: an int >= 1"):
    statistics.per_seed_figures(inf, "accuracy", last=0)


def test_a_pooled_seed_number_is_refused_for_pairing_even_without_a_figure():
  from types import SimpleNamespace
  row = SimpleNamespace(group=SimpleNamespace(label="pooled"), per_seed=[
      {"seed": 0, "accuracy": None}, {"seed": 1, "accuracy": 30.0},  # run A
      {"seed": 0, "accuracy": 40.0}])                                 # run B
  ref = SimpleNamespace(group=SimpleNamespace(label="ref"), per_seed=[
      {"seed": 0, "accuracy": 10.0}, {"seed": 1, "accuracy": 10.0}])
  with pytest.raises(ValueError, match="holds seed 0 twice"):
    report.paired_difference(row, ref)


def test_byte_counts_never_print_an_exponent():
  cases = {999: "999 B", 1000: "1 kB", 999_499: "999 kB", 999_950: "1 MB",
           1_234_567: "1.23 MB", 999_600_000: "1 GB", 2.33e9: "2.33 GB", 1e15: "1000 TB"}
  assert {n: report.format_bytes(n) for n in cases} == cases


def test_runs_differing_only_in_how_they_checkpoint_or_stop_pool(tmp_path):
  write_run(tmp_path / "a", {"run.checkpoint_every": 50, "run.on_divergence": "stop_run"})
  write_run(tmp_path / "b", {"run.checkpoint_every": 10})
  rep = report.build_report([str(tmp_path)])
  assert [r.seeds for r in rep.rows] == [4]


def test_cli_report_warns_on_stderr_and_writes_out(tmp_path, capsys):
  run = write_run(tmp_path / "run", raw_lines=[json.dumps(r) + "\n" for r in make_records()]
                  + ["not json\n"], summary=False)
  os.makedirs(tmp_path / "crashed")  # started, never evaluated: config.json only
  with open(tmp_path / "crashed" / "config.json", "w") as f:
    json.dump({"config": BASE_CONFIG}, f)
  out = tmp_path / "out"
  code = cli.main(["report", run, str(tmp_path / "crashed"), "--out", str(out)])
  cap = capsys.readouterr()
  assert code == 0
  assert "52.50 +- 2.50" in cap.out
  assert f"jsfl: warning: {run}/metrics.jsonl:{7 * 2 + 1}: not valid JSON" in cap.err
  assert f"{tmp_path / 'crashed'}/metrics.jsonl: missing; run skipped" in cap.err
  assert sorted(os.listdir(out)) == ["report.csv", "report.md", "report_seeds.csv"]
  assert f"wrote {out}/report.md" in cap.out


def archive(run_dir):
  """``gzip -9n`` of a run's metrics.jsonl and partition.json, as
  docs/run-directory.md archives a finished run."""
  for name in ("metrics.jsonl", "partition.json"):
    path = os.path.join(run_dir, name)
    with open(path, "rb") as src, open(path + ".gz", "wb") as raw, \
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as dst:
      dst.write(src.read())
    os.remove(path)


def test_an_archived_run_reads_as_the_run_it_was(tmp_path):
  plain = write_run(tmp_path / "plain")
  shutil.copytree(plain, tmp_path / "sweep" / "archived")
  archived = str(tmp_path / "sweep" / "archived")
  archive(archived)
  assert sorted(os.listdir(archived)) == ["config.json", "metrics.jsonl.gz",
                                          "partition.json.gz", "summary.json"]
  a, b = reading.load_run(plain), reading.load_run(archived)
  assert a.problems == b.problems == []
  assert a.records == b.records and a.partition == b.partition and a.partition is not None
  # found by a tree search and by its metrics file, reported alike
  assert reading.find_run_dirs([str(tmp_path / "sweep")]) == ([archived], [])
  assert reading.find_run_dirs([os.path.join(archived, "metrics.jsonl.gz")])[0] == [archived]
  ra, rb = report.build_report([plain]), report.build_report([archived])
  assert ra.rows[0].stats == rb.rows[0].stats and ra.rows[0].per_position == \
      rb.rows[0].per_position


def test_a_damaged_archive_is_named_not_raised(tmp_path):
  run = write_run(tmp_path / "run")
  archive(run)
  gz = os.path.join(run, "metrics.jsonl.gz")
  with open(gz, "rb") as f:
    data = f.read()
  with open(gz, "wb") as f:  # cut short, as an interrupted copy leaves it
    f.write(data[:len(data) // 2])
  with open(os.path.join(run, "partition.json.gz"), "wb") as f:
    f.write(b"not gzip")
  r = reading.load_run(run)
  assert r.records == [] and r.partition is None
  assert len(r.problems) == 2 and all("cannot be read" in p for p in r.problems), r.problems
  assert r.problems[0].startswith(f"{gz}: cannot be read")


def test_cli_report_without_runs_is_an_error(tmp_path, capsys):
  assert cli.main(["report", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert "no run directory" in err and "jsfl: error: no run with a usable metrics.jsonl" in err
  assert cli.main(["report", str(tmp_path), "--last", "0"]) == 2


def test_report_of_the_committed_core_runs_matches_their_summaries():
  # Real runs' output: the report's figures are the ones the run wrote.
  if not os.path.isdir(CORE_RUNS):
    pytest.skip("experiments/core/results/core not present")
  rep = report.build_report([CORE_RUNS])
  cells = [d for d in os.listdir(CORE_RUNS) if os.path.isdir(os.path.join(CORE_RUNS, d))]
  assert rep.problems == [] and len(rep.rows) == len(cells) == 5
  for row in rep.rows:
    (run,) = row.group.runs
    with open(os.path.join(run.path, "summary.json")) as f:
      summ = json.load(f)
    for k in ("accuracy", "pg", "bw"):
      assert row.stats[k]["median"] == pytest.approx(summ[k]["median"], abs=1e-9)
      assert row.stats[k]["std"] == pytest.approx(summ[k]["std"], abs=1e-9)
  assert rep.columns[0] == "method.name" and "partition.name" in rep.columns


def test_summary_table_after_jsfl_run(tmp_path):
  table = report.summary_table(write_run(tmp_path / "run"))
  assert "| sfl / dominant_label / synthetic / small_cnn | 2 | 52.50 +- 2.50 |" in table
  assert "Collapsed" not in table
  recs = make_records()
  for rec in recs:
    if rec["seed"] == 1 and rec["round"] >= 6:
      rec["per_label_accuracy"] = [0.0, 0.0, 0.0, 100.0]
  table = report.summary_table(write_run(tmp_path / "collapsed", records=recs))
  assert table.endswith("Collapsed (one predicted label to the last evaluation; in the "
                        "figures): seed 1 from round 6")


def test_report_and_plots_do_not_import_jax(tmp_path):
  run = write_run(tmp_path / "run")
  code = ("import sys; from jsfl import cli, plots, report; "
          f"assert cli.main(['report', {run!r}]) == 0; "
          "assert 'jax' not in sys.modules, 'jax was imported'")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, check=False)
  assert res.returncode == 0, res.stderr


def test_paired_differences_per_seed_number(tmp_path):
  # sfl per seed: 50, 55 (SERIES); fedavg 3 up in seed 0, 1 down in seed 1;
  # hydra has seeds 1 and 2 only, so it is compared on seed 1 alone.
  write_run(tmp_path / "a")
  write_run(tmp_path / "b", {"method.name": "fedavg"}, records=make_records(
      {0: {**SERIES[0], "accuracy": [a + 3 for a in SERIES[0]["accuracy"]]},
       1: {**SERIES[1], "accuracy": [a - 1 for a in SERIES[1]["accuracy"]]}}))
  write_run(tmp_path / "c", {"method.name": "hydra", "run.seed": 1}, records=make_records(
      {1: {**SERIES[1], "accuracy": [a + 7 for a in SERIES[1]["accuracy"]]},
       2: SERIES[0]}))
  rep = report.build_report([str(tmp_path)], paired_with="sfl")
  assert [r.group.label for r in rep.rows] == ["sfl", "fedavg", "hydra"]
  assert rep.paired_with == "sfl" and rep.paired[0] is None
  fed, hyd = rep.paired[1], rep.paired[2]
  assert fed["seeds"] == [0, 1] and fed["diffs"] == pytest.approx([3.0, -1.0])
  assert fed["median"] == pytest.approx(1.0) and (fed["ahead"], fed["behind"]) == (1, 1)
  assert hyd["seeds"] == [1] and hyd["median"] == pytest.approx(7.0) and hyd["ahead"] == 1
  md = report.to_markdown(rep)
  assert "paired accuracy vs sfl |" in md
  assert "| +1.00 (1 of 2) |" in md and "| +7.00 (1 of 1) |" in md
  paths = report.write_report(rep, str(tmp_path / "out"))
  with open(paths[1]) as f:
    rows = list(csv.DictReader(f))
  assert [(r["paired_accuracy_median"], r["paired_ahead"], r["paired_seeds"])
          for r in rows] == [("", "", ""), ("1.0", "1", "2"), ("7.0", "1", "1")]


def test_paired_reference_must_name_one_row(tmp_path, capsys):
  write_run(tmp_path / "a")
  write_run(tmp_path / "b", {"method.name": "sfl_fedntd"})
  # "sfl" is one row's exact label, so it is not ambiguous with "sfl_fedntd"
  assert report.build_report([str(tmp_path)], paired_with="sfl").paired_with == "sfl"
  assert report.build_report([str(tmp_path)], paired_with=str(tmp_path / "b")
                             ).paired_with == "sfl_fedntd"
  with pytest.raises(ValueError, match="matches rows"):
    report.build_report([str(tmp_path)], paired_with="fl")
  assert cli.main(["report", str(tmp_path), "--paired", "hydra"]) == 2
  err = capsys.readouterr().err
  assert "'hydra' matches no row" in err and "sfl_fedntd" in err


def test_best_moving_average_is_the_authors_figure():
  # trailing windows of <= 3: [1] [1,5] [1,5,3] [5,3,2] [3,2,9] -> means 1, 3, 3, 3.33, 4.67
  best, std = statistics.best_moving_average([1.0, 5.0, 3.0, 2.0, 9.0], window=3)
  assert best == pytest.approx(14 / 3) and std == pytest.approx(np.std([3.0, 2.0, 9.0]))
  # a partial window at the start counts; an equal later mean does not replace it
  assert statistics.best_moving_average([9.0, 1.0, 8.0], window=2) == (9.0, 0.0)
  recs = [{"seed": s, "round": r, "accuracy": a}
          for s, accs in ((0, [10.0, 20.0, 30.0]), (1, [50.0, 40.0, None]))
          for r, a in enumerate(accs, 1)]
  assert statistics.best_ma_figures(recs, window=2) == {0: 25.0, 1: 50.0}


def test_cli_report_best_ma_column(tmp_path, capsys):
  if not os.path.isdir(CORE_RUNS):
    pytest.skip("experiments/core/results/core not present")
  assert cli.main(["report", CORE_RUNS, "--best-ma", "10", "--out", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert "accuracy, best 10-round MA" in out and "Best 10-round MA" in out
  with open(tmp_path / "report.csv") as f:
    assert "best_ma_median" in f.readline()
  assert cli.main(["report", CORE_RUNS, "--best-ma", "-1"]) == 2
  assert "--best-ma=-1" in capsys.readouterr().err


def test_reference_column_beside_jsfl(tmp_path, capsys):
  write_run(tmp_path / "runs" / "a", {"method.name": "sfl", "partition.p": 0.8})
  write_run(tmp_path / "runs" / "b", {"method.name": "fedavg", "partition.p": 0.8})
  write_run(tmp_path / "runs" / "c", {"method.name": "fedavg", "partition.p": 0.6})
  ref = tmp_path / "paper.csv"
  ref.write_text("# Paper X, Table 1 (Fashion-MNIST)\n"
                 "method.name,partition.p,reference,reference_std\n"
                 "sfl,0.8,50.25,1.5\nfedavg,,40,\nhydra,0.8,60,\n")
  rep = report.build_report([str(tmp_path / "runs")], reference=str(ref))
  # fedavg's line leaves partition.p empty: it matches both fedavg rows
  assert [(r or {}).get("reference") for r in rep.reference] == [50.25, 40.0, 40.0]
  assert any("line 5 (method.name=hydra, partition.p=0.8) matches no run" in p
             for p in rep.problems)
  md = report.to_markdown(rep)
  assert "| reference accuracy (%) | jsfl - reference |" in md
  sfl_line = next(line for line in md.splitlines() if line.startswith("| sfl"))
  assert "50.25 +- 1.50 | +2.25 |" in sfl_line  # jsfl 52.50 (see SERIES)
  assert "Reference: Paper X, Table 1 (Fashion-MNIST)" in md
  assert cli.main(["report", str(tmp_path / "runs"), "--reference", str(ref),
                   "--out", str(tmp_path / "out")]) == 0
  with open(tmp_path / "out" / "report.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["reference"] for r in rows] == ["50.25", "40.0", "40.0"]
  bad = tmp_path / "bad.csv"
  bad.write_text("method,reference\nsfl,1\n")
  capsys.readouterr()
  assert cli.main(["report", str(tmp_path / "runs"), "--reference", str(bad)]) == 2
  assert "allowed: config fields (section.key" in capsys.readouterr().err
  bad.write_bytes(b"\xff\xfe\x00method.name,reference\n")  # UTF-16 from a spreadsheet
  assert cli.main(["report", str(tmp_path / "runs"), "--reference", str(bad)]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and "bad.csv' is not UTF-8 text; allowed: a CSV" in err[0], err


def test_one_class_rows():
  one = statistics.predicts_one_class
  assert one([0, 0, 100, 0]) and one([0, 99.9, 0, 0]) and one([0.5, 0, 99.0, 1.0])
  assert not one([0, 98.9, 0, 0])            # the top label short of 99
  assert not one([0, 100, 1.5, 0])           # another label above 1
  assert not one([50, 50, 50, 50]) and not one([100, 100, 0, 0])
  assert not one([float("nan"), 100, 0, 0]) and not one([100])


def test_collapsed_seeds_are_named_from_the_round_they_stay_collapsed(tmp_path):
  """A seed that predicts one class to its last evaluation is named from the
  first round of that stretch; one that collapsed and recovered is not; its
  records stay in the figures (the median over seeds is unchanged)."""
  recs = make_records(cyclic=False)
  at_chance = {3: [0, 0, 100, 0], 4: [0, 99.9, 0, 0], 5: [0, 0, 0, 100], 6: [100, 0, 0, 0],
               7: [0, 0, 100, 0]}
  for rec in recs:
    if rec["seed"] == 0 and rec["round"] in (2, 4, 5, 6, 7):
      rec["per_label_accuracy"] = at_chance.get(rec["round"], [0, 0, 100, 0])
    if rec["seed"] == 1 and rec["round"] in (2, 3):  # collapsed, then recovered
      rec["per_label_accuracy"] = [0, 100, 0, 0]
  assert statistics.collapsed_seeds(recs) == {0: 4}
  rep = report.build_report([write_run(tmp_path / "run", records=recs)])
  assert [s["collapsed_from"] for s in rep.rows[0].per_seed] == [4, None]
  assert rep.rows[0].stats["accuracy"]["median"] == pytest.approx(52.5)
  md = report.to_markdown(rep)
  assert "## Collapsed seeds" in md and "- sfl: seed 0 from round 4 (1 of 2)" in md
  paths = report.write_report(rep, str(tmp_path / "out"))
  with open(paths[2]) as f:
    rows = list(csv.DictReader(f))
  assert [r["collapsed_from"] for r in rows] == ["4", ""]
  plain = report.build_report([write_run(tmp_path / "plain")])
  assert "Collapsed" not in report.to_markdown(plain)


def test_a_config_field_never_takes_a_title_the_table_uses(tmp_path):
  """The table's "rounds" is the last evaluated round: runs that differ in
  run.rounds show that field under its full name."""
  write_run(tmp_path / "a", {"run.rounds": 7})
  write_run(tmp_path / "b", {"run.rounds": 9})
  head = next(line for line in report.to_markdown(
      report.build_report([str(tmp_path)])).splitlines() if line.startswith("| "))
  titles = [t.strip() for t in head.strip("|").split("|")]
  assert titles[titles.index("seeds") - 1:titles.index("seeds") + 2] == [
      "run.rounds", "seeds", "rounds"]
  assert len(titles) == len(set(titles))
