#!/usr/bin/env python3
"""Adapts a clone of the Hydra authors' code for jsfl's Fashion-MNIST setting.

Usage: python3 adapt.py CLONE_DIR

CLONE_DIR is a checkout of github.com/jtirana98/Hydra_tackling-CF-in-SFL at
commit 6606c2a89fd87aa07523811a62c935d0cfc24df8 (README.md says why each
edit is there).  The script

1. copies our own modules next to their code: ``models/`` (the model
   definitions their repository lacks), ``jsfl_glue.py``, a placeholder
   ``flwr_datasets/``, and from ``../../multisfl/authors_code/``
   ``fmnist_idx.py`` and ``torchvision_shim/`` (as ``torchvision/``);
2. applies the line edits in ``EDITS``: each names a line of theirs, exactly
   as it stands (or, with ``prefix``, its start), that must occur ``count``
   times in the file (once unless said); the edit inserts lines before or
   after each occurrence, or rewrites a substring of it.  A line not found
   that many times stops the script before anything is written, naming it.
   Inserted and rewritten lines end in ``# [adapt]``; inserted lines carry
   the line's indentation plus their own.
3. writes ``CLONE_DIR/.jsfl_adapted`` so that a second run refuses.

None of their algorithms is touched: the edits add command-line options,
seeding, Fashion-MNIST, our models, a per-round log, and disable their
per-round ``bw_score`` (it indexes a flat list as a matrix and raises
``TypeError``; ``parse.py`` computes BW from the logged per-label accuracies).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

COMMIT = "6606c2a89fd87aa07523811a62c935d0cfc24df8"
HERE = os.path.dirname(os.path.abspath(__file__))
MULTISFL = os.path.join(HERE, "..", "..", "multisfl", "authors_code")
OUR_MODULES = {os.path.join(HERE, "models"): "models",
               os.path.join(HERE, "flwr_datasets"): "flwr_datasets",
               os.path.join(HERE, "jsfl_glue.py"): "jsfl_glue.py",
               os.path.join(MULTISFL, "fmnist_idx.py"): "fmnist_idx.py",
               os.path.join(MULTISFL, "torchvision_shim"): "torchvision"}
TAG = "  # [adapt]"
SCRIPTS = ("run_sfl.py", "run_hydra.py", "test_hydra_heads.py", "run_fl.py", "run_sflv3.py",
           "run_multihead.py", "run_mergesfl.py")


@dataclasses.dataclass
class Edit:
  file: str
  line: str                       # their line, verbatim (or its start, with prefix)
  before: tuple[str, ...] = ()    # inserted above it (relative indentation)
  after: tuple[str, ...] = ()     # inserted below it
  sub: tuple[tuple[str, str], ...] = ()  # (old, new) substrings rewritten in it
  prefix: bool = False
  count: int = 1
  why: str = ""


OPTIONS = ("parser.add_argument('--seed', type=int, default=0)",
           "parser.add_argument('--round_log', type=str, default='')",
           "parser.add_argument('--threads', type=int, default=1)",
           "parser.add_argument('--width', type=float, default=1.0)",
           "parser.add_argument('--train_subset', type=int, default=0)")

EDITS = []
for script in SCRIPTS:
  EDITS += [
      Edit(script, "    args = parser.parse_args()", before=OPTIONS,
           why="seed, per-round log, torch threads, model width, jsfl's training subset"),
      Edit(script, "    args = init_parameters()",
           after=("import jsfl_glue; jsfl_glue.setup(args)",),
           why="seeding (they seed nothing), threads, logs_training/"),
      Edit(script, "    for epoch in range(args.epoch):", after=("    jsfl_glue.round_start()",),
           why="round clock"),
      Edit(script, ("        forg_score, scores, epoch_accuracy" if script in (
          "run_sflv3.py", "run_multihead.py") else "        epoch_loss, epoch_accuracy ="),
           before=("jsfl_glue.eval_start()",), prefix=True,
           why="training vs evaluation time"),
      Edit(script, "        logger.info(f'>>>>> Backward Tranfer: {bw_score_val}')",
           after=("jsfl_glue.record(locals())",), why="per-round JSONL record"),
  ]
EDITS += [
    Edit("my_utils.py", "data_sets_attributes = {", after=("    'fashion-mnist': {'label': 10},",),
         why="Fashion-MNIST's label count"),
    Edit("my_utils.py", "    bw_score_val = bw_score(scores_accuracy, target[1])", count=4,
         sub=(("bw_score(scores_accuracy, target[1])", "None"),),
         why="bw_score indexes one round's per-label list as a rounds x labels matrix: "
             "TypeError"),
    Edit("get_data.py", "    return train_dataset, test_dataset",
         before=("if dataset_type == 'fashion-mnist':",
                 "    import jsfl_glue; train_dataset, test_dataset = jsfl_glue.fashion_mnist()"),
         why="Fashion-MNIST from local files, jsfl's subset and normalisation"),
    Edit("get_data.py", "    if dataset_type in [\"cifar10\", 'SVHN']:",
         sub=(("'SVHN']", "'SVHN', 'fashion-mnist']"),), why="10 classes"),
    Edit("get_data.py", "    partition_method_apply = 'flower'",
         after=("if dataset_type == 'fashion-mnist' and partition_method == 'dl':",
                "    partition_method_apply = 'mergesfl'"),
         why="their dominant-label partition code (the CIFAR-10 'dl' path)"),
    Edit("get_models.py",
         "def get_model(model_name, dataset, cut, num_clients, is_fl=False, is_fl3=False, other=None):",
         after=("    if dataset == 'fashion-mnist':",
                "        import jsfl_glue; return jsfl_glue.get_model(model_name, dataset, cut, "
                "num_clients, is_fl, is_fl3, other)"),
         why="1 input channel, 10 classes, our small CNN"),
    Edit("get_models.py",
         "def get_model_threesplit(model_name, dataset, cut_a, cut_b, num_clients, other=None):",
         after=("    if dataset == 'fashion-mnist':",
                "        import jsfl_glue; return jsfl_glue.get_model_threesplit(model_name, "
                "dataset, cut_a, cut_b, num_clients, other)"),
         why="1 input channel, 10 classes, our small CNN"),
]


def apply(clone: str, edit: Edit, files: dict[str, list[str]]) -> None:
  path = os.path.join(clone, edit.file)
  if edit.file not in files:
    if not os.path.exists(path):
      raise SystemExit(f"adapt.py: {path} missing; is {clone} a clone of Hydra?")
    with open(path, encoding="utf-8") as f:
      files[edit.file] = f.read().split("\n")
  lines = files[edit.file]
  hit = (lambda s: s.startswith(edit.line)) if edit.prefix else (lambda s: s == edit.line)
  hits = [i for i, s in enumerate(lines) if hit(s)]
  if len(hits) != edit.count:
    raise SystemExit(f"adapt.py: expected the line {edit.count} time(s) in {edit.file}, found "
                     f"it {len(hits)} times:\n  {edit.line!r}\n(a different commit? this recipe "
                     f"is for {COMMIT})")
  for i in reversed(hits):
    line = lines[i]
    indent = line[:len(line) - len(line.lstrip())]
    for old, new in edit.sub:
      if line.count(old) != 1:
        raise SystemExit(f"adapt.py: {old!r} not once in {edit.file} line {i + 1}: {line!r}")
      line = line.replace(old, new)
    if edit.sub:
      line += TAG
    lines[i:i + 1] = ([indent + b + TAG for b in edit.before] + [line]
                      + [indent + a + TAG for a in edit.after])


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  clone = argv[1]
  marker = os.path.join(clone, ".jsfl_adapted")
  if os.path.exists(marker):
    raise SystemExit(f"adapt.py: {clone} is already adapted ({marker}); use a fresh clone")
  try:
    head = subprocess.run(["git", "-C", clone, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if head != COMMIT:
      print(f"adapt.py: warning: {clone} is at {head}, the recipe is for {COMMIT}",
            file=sys.stderr)
  except (OSError, subprocess.CalledProcessError):
    print(f"adapt.py: {clone} is not a git checkout; not checking its commit", file=sys.stderr)
  files: dict[str, list[str]] = {}
  for e in EDITS:  # all or nothing: every line is found before anything is written
    apply(clone, e, files)
  for name, lines in files.items():
    with open(os.path.join(clone, name), "w", encoding="utf-8") as f:
      f.write("\n".join(lines))
  for src, dst in OUR_MODULES.items():
    d = os.path.join(clone, dst)
    if os.path.isdir(src):
      shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy2(src, d)
  with open(marker, "w") as f:
    f.write(f"adapted by jsfl experiments/hydra/authors_code/adapt.py for {COMMIT}\n")
  print(f"adapt.py: {len(EDITS)} edits in {len(files)} files; copied "
        f"{', '.join(OUR_MODULES.values())} into {clone}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
