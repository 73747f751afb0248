"""The run directories committed under experiments/ (no training, no jax).

Every directory there that holds ``metrics.jsonl.gz`` is a run directory
(docs/run-directory.md) and keeps its contract: ``config.json``,
``partition.json.gz``, ``metrics.jsonl.gz`` and ``summary.json``, plus
``groups.json`` where the run's method is Hydra.  The two record files are
archived (``gzip -9n``; docs/run-directory.md, "Archived runs"): plain they
would be most of the checkout, which a GPU lease copies within a size
limit.  No file or folder name
under experiments/ is longer than a sweep cell's name may be
(jsfl.sweep.format.NAME_LIMIT, 60 characters), so the tree checks out on
every file system and reads in a listing.  Every run is finished (its last
evaluated round is its ``run.rounds``) unless the ``partial.toml`` of its
family's results (experiments/sequential/results/partial.toml) names it
with why, and every name there is an unfinished run.  One
case per top-level folder of experiments/, so a folder that is not yet in
shape fails alone.
"""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from jsfl.sweep.format import NAME_LIMIT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")
CONTRACT = ("config.json", "partition.json.gz", "metrics.jsonl.gz", "summary.json")
PLAIN = ("metrics.jsonl", "partition.json")  # archived, not committed plain
FOLDERS = sorted(d for d in os.listdir(EXPERIMENTS)
                 if os.path.isdir(os.path.join(EXPERIMENTS, d)) and not d.startswith("."))


def case(folder):
  return pytest.param(folder, id=folder)


def walk(folder):
  """(directory, its sub-directories, its files) under experiments/<folder>,
  hidden entries left out (a sweep's ``.batch-*`` while it trains)."""
  for d, dirs, files in os.walk(os.path.join(EXPERIMENTS, folder)):
    dirs[:] = sorted(x for x in dirs if not x.startswith("."))
    yield d, dirs, [f for f in files if not f.startswith(".")]


def test_there_are_committed_runs():
  runs = [d for f in FOLDERS for d, _, files in walk(f) if "metrics.jsonl.gz" in files]
  assert len(runs) > 100, runs


@pytest.mark.parametrize("folder", [case(f) for f in FOLDERS])
def test_run_directories_keep_their_contract(folder):
  bad = []
  for d, _, files in walk(folder):
    plain = [p for p in PLAIN if p in files]
    if plain:
      bad.append(f"{os.path.relpath(d, ROOT)}: {', '.join(plain)} not archived "
                 "(gzip -9n them)")
    if "metrics.jsonl.gz" not in files and "metrics.jsonl" not in files:
      continue
    want = list(CONTRACT)
    if "config.json" in files:
      with open(os.path.join(d, "config.json")) as f:
        meta = json.load(f)
      if meta.get("config", {}).get("method", {}).get("name") == "hydra":
        want.append("groups.json")
    missing = [w for w in want if w not in files]
    if missing:
      bad.append(f"{os.path.relpath(d, ROOT)}: no {', '.join(missing)}")
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", [case(f) for f in FOLDERS])
def test_no_name_over_the_limit(folder):
  long = []
  for d, dirs, files in walk(folder):
    for name in dirs + files:
      if len(name) > NAME_LIMIT:
        long.append(f"{os.path.relpath(os.path.join(d, name), ROOT)} ({len(name)})")
  assert not long, f"{len(long)} names over {NAME_LIMIT} characters:\n" + "\n".join(long)


def unfinished(run_dir: str) -> str | None:
  """Why a committed run directory is not finished (None if it is): its
  summary's last evaluated round against its config's ``run.rounds``."""
  with open(os.path.join(run_dir, "config.json")) as f:
    rounds = json.load(f)["config"]["run"]["rounds"]
  with open(os.path.join(run_dir, "summary.json")) as f:
    done = json.load(f).get("rounds_evaluated")
  return None if done == rounds else f"{done} of {rounds} rounds"


@pytest.mark.parametrize("folder", [case(f) for f in FOLDERS])
def test_committed_runs_are_finished_or_listed_as_partial(folder):
  listed: dict[str, str] = {}
  path = os.path.join(EXPERIMENTS, folder, "results", "partial.toml")
  if os.path.exists(path):
    with open(path, "rb") as f:
      listed = tomllib.load(f)
  root = os.path.join(EXPERIMENTS, folder, "results")
  bad, seen = [], set()
  for d, _, files in walk(folder):
    if "summary.json" not in files or "config.json" not in files:
      continue
    name = os.path.relpath(d, root)
    why = unfinished(d)
    if name in listed:
      seen.add(name)
      if why is None:
        bad.append(f"{name}: finished, but listed in {os.path.relpath(path, ROOT)}")
    elif why is not None:
      bad.append(f"{os.path.relpath(d, ROOT)}: {why}; finish it, or name it with why "
                 f"in {os.path.relpath(path, ROOT)}")
  bad += [f"{os.path.relpath(path, ROOT)}: {name!r} names no run directory"
          for name in sorted(set(listed) - seen)]
  assert not bad, "\n".join(bad)

