"""Glue between the Hydra authors' code and jsfl's Fashion-MNIST setting.

Our own module; ``adapt.py`` copies it into their clone and adds calls to it
(each marked ``# [adapt]``):

* ``setup(args)`` right after their ``init_parameters()``: seeds Python's,
  NumPy's and torch's generators with ``--seed`` (their scripts seed
  nothing), sets torch's thread count (``--threads``), records ``--width``
  (MobileNetV1 / ResNet-18 width multiplier) and creates ``logs_training/``
  (their logger writes there and fails if it is missing);
* ``fashion_mnist()`` in their ``get_data.load_datasets``: the training set
  (or jsfl's stratified ``--train_subset``, the same images jsfl's
  ``dataset.train_subset`` keeps) and the 10k test set, normalised as jsfl
  normalises them; their dominant-label partitioner then splits it;
* ``get_model`` / ``get_model_threesplit`` for ``fashion-mnist``: their
  ``get_models`` functions' return structure, with our models (``models/``)
  at 1 input channel and 10 classes;
* ``round_start()``, ``eval_start()`` and ``record(locals())`` around every
  round: one JSON line per round in ``--round_log`` (see ``record``).
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import torch

import fmnist_idx

WIDTH = 1.0
_ARGS = None
_CLOCK = {"t0": None, "c0": None, "eval": None, "ceval": None}


def setup(args) -> None:
  global WIDTH, _ARGS
  _ARGS = args
  WIDTH = float(args.width)
  random.seed(args.seed)
  np.random.seed(args.seed)
  torch.manual_seed(args.seed)
  torch.set_num_threads(args.threads)
  os.makedirs("logs_training", exist_ok=True)
  if args.round_log:
    os.makedirs(os.path.dirname(os.path.abspath(args.round_log)), exist_ok=True)
    open(args.round_log, "w").close()


# ------------------------------------------------------------------ data
def train_subset(y: np.ndarray, n: int) -> np.ndarray:
  """The indices jsfl's ``dataset.train_subset = n`` keeps: per label its
  share of n (largest remainders get the leftovers), drawn from one
  permutation of NumPy's ``default_rng(0)``, sorted."""
  rng = np.random.default_rng(0)
  perm = rng.permutation(y.shape[0])
  labels, counts = np.unique(y, return_counts=True)
  quota = np.floor(counts * n / y.shape[0]).astype(int)
  rest = n - quota.sum()
  quota[np.argsort(-(counts * n / y.shape[0] - quota), kind="stable")[:rest]] += 1
  keep = np.concatenate([perm[y[perm] == lab][:q] for lab, q in zip(labels, quota)])
  return np.sort(keep)


class Images(torch.utils.data.Dataset):
  """Normalised images ``(N, 1, 28, 28)`` and labels, with the ``classes`` /
  ``targets`` attributes their partitioner reads.  The images are normalised
  once up front (their torchvision path would transform each sample as it
  is loaded: this only makes their runs faster)."""

  classes = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
             "Sneaker", "Bag", "Ankle boot")

  def __init__(self, x_uint8, y, mean, std):
    x = (torch.from_numpy(x_uint8).float() / 255.0 - mean) / std
    self.data = x.unsqueeze(1).contiguous()
    self.targets = torch.from_numpy(y.astype(np.int64))

  def __len__(self):
    return len(self.targets)

  def __getitem__(self, i):
    return self.data[i], int(self.targets[i])


def fashion_mnist():
  """``(train, test)`` as jsfl feeds them: the mean and (population) std of
  the training images kept (``fmnist_idx.channel_stats``, jsfl's formula)."""
  x, y = fmnist_idx.load(train=True)
  n = int(getattr(_ARGS, "train_subset", 0) or 0)
  if n:
    keep = train_subset(y, n)
    x, y = x[keep], y[keep]
  mean, std = fmnist_idx.channel_stats(x)
  xt, yt = fmnist_idx.load(train=False)
  return Images(x, y, mean, std), Images(xt, yt, mean, std)


# ---------------------------------------------------------------- models
def _net(model_name, start, end):
  if model_name == "small_cnn":
    from models.small_cnn import SmallCNN
    return SmallCNN(1, 10, start, end)
  if model_name == "mobilenet":
    from models.mobilenet import MobileNetV1
    return MobileNetV1(1, 10, start, end)
  if model_name == "resnet18":
    from models.resnet import get_resnet_split
    return get_resnet_split(1, 10, start, end, model_name)
  raise ValueError(f"model {model_name!r}; allowed: small_cnn, mobilenet, resnet18")


def get_model(model_name, dataset, cut, num_clients, is_fl=False, is_fl3=False, other=None):
  """Their ``get_models.get_model`` for Fashion-MNIST (same return values)."""
  if is_fl:
    return _net(model_name, -1, -1), [_net(model_name, -1, -1) for _ in range(num_clients)]
  pair = (_net(model_name, -1, cut), _net(model_name, cut, -1))
  nets = [_net(model_name, -1, cut) for _ in range(num_clients)]
  if is_fl3:
    return pair, nets, [_net(model_name, cut, -1) for _ in range(num_clients)]
  return pair, nets


def get_model_threesplit(model_name, dataset, cut_a, cut_b, num_clients, other=None):
  """Their ``get_models.get_model_threesplit`` for Fashion-MNIST."""
  parts = (_net(model_name, -1, cut_a), _net(model_name, cut_a, cut_b),
           _net(model_name, cut_b, -1))
  return parts, ([_net(model_name, -1, cut_a) for _ in range(num_clients)],
                 [_net(model_name, cut_b, -1) for _ in range(num_clients)])


# ------------------------------------------------------------- round log
def round_start() -> None:
  _CLOCK["t0"], _CLOCK["c0"] = time.perf_counter(), time.process_time()


def eval_start() -> None:
  _CLOCK["eval"], _CLOCK["ceval"] = time.perf_counter(), time.process_time()


def record(loc: dict) -> None:
  """Appends the round's JSON line to ``--round_log``.

  ``loc`` is their ``main()``'s ``locals()`` after the round's evaluation:
  ``epoch``, ``epoch_accuracy``, ``forg_score`` and ``acc_scores`` (or
  ``scores``), ``artificial_order`` in cyclic / reverse order,
  and ``trainloaders``.  Fields: ``round`` (1-based), ``script``,
  ``cell`` (``$JSFL_CELL``), ``seed``, ``accuracy`` (% of the 10k test set),
  ``pg`` (their performance gap in percentage points = max - mean of the
  per-label accuracies, jsfl's PG), ``per_label`` (%), ``label_order`` (the
  clients in the server's cyclic order; client i is dominant in label i),
  ``samples`` (training samples this round: their loaders drop the last
  partial batch), ``train_s`` / ``train_cpu_s`` (round start to evaluation,
  wall and process CPU seconds) and ``eval_s``.
  """
  args = _ARGS  # their ``args`` is a module global, set in main()
  if not args.round_log:
    return
  now, cnow = time.perf_counter(), time.process_time()
  per_label = loc["acc_scores"] if "acc_scores" in loc else loc["scores"]
  order = loc.get("artificial_order") if args.__dict__.get("policy") in ("cyclic", "reverse") else None
  samples = sum(len(t) for t in loc["trainloaders"]) * args.batch_size * args.local_epoch
  rec = {"round": int(loc["epoch"]) + 1, "script": os.path.basename(
      __import__("sys").argv[0]), "cell": os.environ.get("JSFL_CELL", ""),
         "seed": args.seed, "accuracy": 100.0 * float(loc["epoch_accuracy"]),
         "pg": 100.0 * float(loc["forg_score"]),
         "per_label": [100.0 * float(a) for a in per_label],
         "label_order": None if order is None else [int(c) for c in order],
         "samples": int(samples),
         "train_s": _CLOCK["eval"] - _CLOCK["t0"],
         "train_cpu_s": _CLOCK["ceval"] - _CLOCK["c0"],
         "eval_s": now - _CLOCK["eval"]}
  if rec["round"] == 1:
    rec["args"] = {k: v for k, v in vars(args).items() if k != "round_log"}
  with open(args.round_log, "a") as f:
    f.write(json.dumps(rec) + "\n")
