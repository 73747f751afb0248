#!/usr/bin/env python3
"""Adapts a clone of the MultiSFL authors' code for jsfl's Fashion-MNIST setting.

Usage: python3 adapt.py CLONE_DIR

CLONE_DIR is a fresh checkout of github.com/CodeFree-xzk/MultiSFL at commit
e9e5f5ff4ad93bd172d08d4f6f0a7a20dcca2fb2 (README.md says why each edit is
there).  The script

1. copies our own modules next to their code: ``torchvision_shim/`` as
   ``torchvision/``, ``fmnist_idx.py``, ``small_cnn_torch.py``,
   ``round_log.py``;
2. applies the line edits in ``EDITS``: each names one line of theirs,
   exactly as it stands (indentation included), that must occur exactly once
   in the file (or in the named class); the edit inserts lines before or after
   it, or rewrites a substring of it.  A line not found, or found twice, stops
   the script before anything is written, naming it.  Inserted lines carry
   the line's indentation and end in ``# [adapt]``.
3. writes ``CLONE_DIR/.jsfl_adapted`` so that a second run refuses.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

COMMIT = "e9e5f5ff4ad93bd172d08d4f6f0a7a20dcca2fb2"
HERE = os.path.dirname(os.path.abspath(__file__))
OUR_MODULES = {"torchvision_shim": "torchvision", "fmnist_idx.py": "fmnist_idx.py",
               "small_cnn_torch.py": "small_cnn_torch.py", "round_log.py": "round_log.py"}
TAG = "  # [adapt]"


@dataclasses.dataclass
class Edit:
  file: str
  line: str                       # their line, verbatim
  before: tuple[str, ...] = ()    # inserted above it (relative indentation)
  after: tuple[str, ...] = ()     # inserted below it
  sub: tuple[tuple[str, str], ...] = ()  # (old, new) substrings rewritten in it
  within: str | None = None       # search only in this class's body
  why: str = ""


WHILE = "        while (self.traffic / 1024 / 1024) < self.args.comm_limit:"
STOP_AT_EPOCHS = (("while (", "while round_log.tick(self) and ("),
                  ("comm_limit:", "comm_limit and self.round < self.args.epochs:"))

EDITS = [
    # --- main_fed.py: threads, and the small CNN as net_glob / client / server
    Edit("main_fed.py", "    set_random_seed(args.seed)",
         before=("import torch; torch.set_num_threads(args.threads)",),
         why="one intra-op thread (the machine's other core is busy)"),
    Edit("main_fed.py", "    net_glob.to(args.device)",
         before=("if args.model == 'small_cnn':",
                 "    import small_cnn_torch; net_glob, small_cnn_client, small_cnn_server = small_cnn_torch.build(args)"),
         why="jsfl's small CNN (BN, cut 2); their model switch has no entry for it"),
    Edit("main_fed.py", "    net_glob_client.to(args.device)",
         before=("if args.model == 'small_cnn':",
                 "    net_glob_client, net_glob_server = small_cnn_client, small_cnn_server"),
         why="the split pair (they build one for resnet / vgg only)"),
    # --- utils/options.py: two options of ours
    Edit("utils/options.py", "    args = parser.parse_args()",
         before=("parser.add_argument('--threads', type=int, default=1)",
                 "parser.add_argument('--round_log', type=str, default='')"),
         why="thread count; path of the per-round JSONL log"),
    # --- utils/get_dataset.py: jsfl's normalisation, their Dirichlet split
    Edit("utils/get_dataset.py", "        trans = transforms.Compose([transforms.ToTensor()])",
         before=("import fmnist_idx",),
         sub=(("ToTensor()]", "ToTensor(), transforms.Normalize(*fmnist_idx.mean_std())]"),),
         why="normalise as jsfl does (their FMNIST path only scales to [0, 1])"),
    Edit("utils/get_dataset.py",
         "                dict_users = fashion_mnist_noniid(dataset_train, args.num_users, case=args.noniid_case)",
         sub=(("fashion_mnist_noniid(dataset_train, args.num_users, case=args.noniid_case)",
               "separate_data(dataset_train, args.num_users, args.num_classes, args.data_beta)"),),
         why="their Dirichlet split (used for CIFAR) instead of their FMNIST shard split"),
    # --- Algorithm/Training.py: evaluation clock, per-round record (SFL, FL)
    Edit("Algorithm/Training.py",
         "        self.acc, self.loss = test(self.net_glob, self.dataset_test, self.args)",
         before=("import round_log; round_log.mark_eval()",), why="training vs evaluation time"),
    Edit("Algorithm/Training.py", "    def log(self):",
         after=("    import round_log; round_log.record(self)",), why="per-round JSONL record"),
    # --- Algorithm/Training_MultiSFL.py
    Edit("Algorithm/Training_MultiSFL.py",
         "        self.classify_count = [[[1] for _ in range(DATASET_SIZE)] for _ in range(self.repoSize)]",
         sub=(("range(DATASET_SIZE)", "range(len(dataset_train))"),),
         why="DATASET_SIZE = 50000 (CIFAR's train size): sample indices >= 50000 of the 60k FMNIST set overflow"),
    Edit("Algorithm/Training_MultiSFL.py", '        if args.model == "resnet":',
         before=('if args.model == "small_cnn":',
                 "    import small_cnn_torch; self.feature_size, self.model_size = small_cnn_torch.FEATURE_BYTES, small_cnn_torch.CLIENT_BYTES"),
         why="their traffic counter's sizes (set for resnet / vgg only; AttributeError otherwise)"),
    Edit("Algorithm/Training_MultiSFL.py", WHILE, before=("import round_log",),
         sub=(("while (", "while round_log.tick(self, p=SAMPLE_BUDGET) and ("), STOP_AT_EPOCHS[1]),
         why="stop after --epochs rounds (they stop on a traffic budget only); round clock, p used"),
    Edit("Algorithm/Training_MultiSFL.py", "    def log(self):",
         after=("    import round_log; round_log.record(self, p_next=SAMPLE_BUDGET)",),
         why="per-round JSONL record"),
    Edit("Algorithm/Training_MultiSFL.py",
         "            sampledData = self.sampleData(helpers, provide_data, modelIdx)",
         after=('import round_log; round_log.count("replay_pool", len(sampledData))',),
         why="helper samples drawn per branch"),
    # --- Algorithm/Training_SFL.py, Training_FL.py: round cap and clock
    Edit("Algorithm/Training_SFL.py", WHILE, before=("import round_log",), sub=STOP_AT_EPOCHS,
         why="stop after --epochs rounds; round clock"),
    Edit("Algorithm/Training_FL.py", WHILE, before=("import round_log",), sub=STOP_AT_EPOCHS,
         why="stop after --epochs rounds; round clock"),
    # --- models/Update.py: samples through part-1
    Edit("models/Update.py", "                all_indexes.extend(idxes_client)",
         after=('import round_log; round_log.count("main", len(labels))',), within="LocalUpdate_MultiSFL",
         why="MultiSFL: the client's samples through part-1"),
    Edit("models/Update.py", "                    all_indexes.extend(idxes_server)",
         after=('import round_log; round_log.count("helper", len(labels_helper))',),
         within="LocalUpdate_MultiSFL", why="MultiSFL: helper (replay) samples through part-1's copy"),
    Edit("models/Update.py", "                all_fx = net_client(images)",
         after=('import round_log; round_log.count("main", len(labels))',), within="LocalUpdate_SFL",
         why="SFL: samples through part-1"),
    Edit("models/Update.py", "                log_probs = net(images)['output']",
         after=('import round_log; round_log.count("main", len(labels))',), within="LocalUpdate_FedAvg",
         why="FedAvg: samples through the model"),
]


def _region(lines: list[str], within: str | None, path: str) -> tuple[int, int]:
  if within is None:
    return 0, len(lines)
  starts = [i for i, l in enumerate(lines)
            if l.startswith((f"class {within}(", f"class {within}:"))]
  if len(starts) != 1:
    raise SystemExit(f"adapt.py: class {within} found {len(starts)} times in {path}")
  end = next((j for j in range(starts[0] + 1, len(lines)) if lines[j].startswith("class ")),
             len(lines))
  return starts[0], end


def apply(clone: str, edit: Edit, files: dict[str, list[str]]) -> None:
  path = os.path.join(clone, edit.file)
  if edit.file not in files:
    if not os.path.exists(path):
      raise SystemExit(f"adapt.py: {path} missing; is {clone} a clone of MultiSFL?")
    with open(path, encoding="utf-8") as f:
      files[edit.file] = f.read().split("\n")
  lines = files[edit.file]
  lo, hi = _region(lines, edit.within, path)
  hits = [i for i in range(lo, hi) if lines[i] == edit.line]
  if len(hits) != 1:
    where = f" in class {edit.within}" if edit.within else ""
    raise SystemExit(f"adapt.py: expected the line once{where} in {edit.file}, found it "
                     f"{len(hits)} times:\n  {edit.line!r}\n(a different commit? this recipe "
                     f"is for {COMMIT})")
  i = hits[0]
  indent = edit.line[:len(edit.line) - len(edit.line.lstrip())]
  line = edit.line
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
    s, d = os.path.join(HERE, src), os.path.join(clone, dst)
    if os.path.isdir(s):
      shutil.copytree(s, d, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      shutil.copy2(s, d)
  with open(marker, "w") as f:
    f.write(f"adapted by jsfl experiments/multisfl/authors_code/adapt.py for {COMMIT}\n")
  print(f"adapt.py: {len(EDITS)} edits in {len(files)} files; copied "
        f"{', '.join(OUR_MODULES.values())} into {clone}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
