"""The authors' half of the step trace: their ``run_sfl.py``, unchanged, from
jsfl's weights, batches and order (``trace_jsfl.py``'s file).

Runs their script's ``main()`` in the adapted clone with four things swapped
in from the trace: the models' initial weights (jsfl's, by path), each
client's loader (its batches of the trace; their index set for the client
is checked to hold them), the order their code draws with
``random.randint`` (jsfl's: the cyclic order, or under ``random`` each
step's pick in their job buffer), and a hook on ``torch.optim.SGD.step`` that
records the server portion after each server step the trace lists.  The lr
is float32's 0.05 (jsfl's), so the two sides start from the same numbers.
``--f64`` makes the models and the inputs float64.

Run with the authors' venv (``README.md`` step 2)::

    /work/authors/venv/bin/python experiments/hydra/authors_code/trace_authors.py \
        /tmp/trace/jsfl64.npz /tmp/trace/authors64.npz --f64

``CLONE`` names the adapted clone (default ``/work/authors/Hydra``).
Writes ``k<k>:<path>`` (the server after step ``k``, jsfl's layout).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

CUT = 4  # ../fmnist_mobilenet.toml's model.cut
SETTING = ["--model_name", "mobilenet", "--width", "0.5", "--dataset_type", "fashion-mnist",
           "--num_clients", "10", "--partition_method", "dl", "--alpha", "4",
           "--batch_size", "64", "--training_lr", repr(float(np.float32(0.05))),
           "--decay_rate", "0.993", "--min_lr", "0.005", "--device", "cpu",
           "--train_subset", "6000", "--threads", "1", "--policy", "cyclic", "--phi", "1",
           "--cut", str(CUT), "--epoch", "1", "--seed", "0"]


def tensors(net, lo):
  """jsfl path -> (tensor, axis order from jsfl's layout to PyTorch's) for a
  ``models.staged.Staged`` MobileNetV1 range starting at stage ``lo``, by
  ``torch_reference.py``'s mapping."""
  import torch
  import torch_reference as ref
  table: dict = {}
  for j, stage in enumerate(net):
    i = lo + j
    if isinstance(stage, torch.nn.Sequential):  # conv - BN - relu
      ref._conv(table, f"{i}/conv", stage[0])
      ref._bn(table, table, f"{i}/norm", stage[1])
    else:
      ref._linear(table, f"{i}/dense/linear", stage.fc)
  return {path: (t, perm) for path, (t, _, perm) in table.items()}


def snapshot(net, lo, prefix, out):
  """``out[prefix + path]``: a float64 copy of every tensor in jsfl's layout
  (a copy: later steps update the tensors in place)."""
  for path, (t, perm) in tensors(net, lo).items():
    v = t.detach().numpy().astype(np.float64)
    out[prefix + path] = v.transpose(np.argsort(perm)) if perm else v


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("trace")
  ap.add_argument("out")
  ap.add_argument("--f64", action="store_true")
  ap.add_argument("--rounds", action="store_true",
                  help="run the trace's whole rounds (one batch a client) instead of its "
                       "steps, recording the model after each round")
  ap.add_argument("--lr", type=float, default=0.05)
  ap.add_argument("--lr-min", type=float, default=0.005)
  args = ap.parse_args(argv)
  trace = np.load(os.path.abspath(args.trace))
  out_file = os.path.abspath(args.out)
  clone = os.environ.get("CLONE", "/work/authors/Hydra")
  os.chdir(clone)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_reference
  sys.path.insert(0, clone)
  import random

  import get_data
  import get_models
  import jsfl_glue
  import torch

  dtype = np.float64 if args.f64 else np.float32
  steps = [] if args.rounds else [int(k) for k in trace["steps"]]
  rounds = int(trace["rounds"]) if args.rounds else 1
  if args.rounds and rounds < 1:
    sys.exit("trace_authors: the trace has no rounds (trace_jsfl.py --rounds R)")
  policy = str(trace["policy"]) if "policy" in trace.files else "cyclic"
  if policy == "random" and not args.rounds:
    sys.exit("trace_authors: a random-order trace has whole rounds only: give --rounds")
  setting = [a for a in SETTING]
  for flag, value in (("--policy", policy), ("--training_lr", repr(float(np.float32(args.lr)))),
                      ("--min_lr", repr(args.lr_min)), ("--epoch", str(rounds))):
    setting[setting.index(flag) + 1] = value
  models = {}

  def load(net, lo):
    if args.f64:
      net.double()
    for path, (t, perm) in tensors(net, lo).items():
      v = trace[f"init:{path}"]
      t.data = torch.from_numpy(np.ascontiguousarray(v.transpose(perm) if perm else v,
                                                     dtype=dtype))

  their_get_model = get_models.get_model

  def get_model(*a, **k):
    (part1, server), nets = their_get_model(*a, **k)
    if not models:  # the first call builds the run's models; the second a spare
      load(part1, 0)
      load(server, CUT)
      models.update(part1=part1, server=server)
    if args.f64:  # the clients and the evaluation's spare copy state dicts into these
      for n in (part1, server, *nets):
        n.double()
    return (part1, server), nets

  get_models.get_model = get_model

  def images(x_uint8, mean, std):
    x = torch.from_numpy(x_uint8).to(torch.float64 if args.f64 else torch.float32)
    return ((x / 255.0 - float(mean)) / float(std)).unsqueeze(1)

  current = [0]  # the round (their loop makes a client's iterator twice a round)

  class Batches:
    """A client's loader: its batches of the trace in each round (as many
    as ``trace_jsfl.py --batches`` kept)."""

    def __init__(self, rounds_of_batches):
      self.rounds = rounds_of_batches

    def now(self):
      return self.rounds[min(current[0], len(self.rounds) - 1)]

    def __len__(self):
      return len(self.now())

    def __iter__(self):
      yield from self.now()

  class Test:
    """Their evaluation reads ``loader.dataset`` and iterates batches."""

    def __init__(self, x, y):
      self.x, self.y, self.dataset, self.loader = x, y, y, self

    def __len__(self):
      return -(-len(self.y) // 64)

    def __iter__(self):
      for i in range(0, len(self.y), 64):
        yield self.x[i:i + 64], self.y[i:i + 64]

  their_partition = get_data.get_data_partition

  def get_data_partition(*a, **k):
    loaders, val, _, how = their_partition(*a, **k)
    fi = jsfl_glue.fmnist_idx
    x, y = fi.load(train=True)
    keep = jsfl_glue.train_subset(y, 6000)
    x, y = x[keep], y[keep]
    mean, std = (float(np.float32(v)) for v in fi.channel_stats(x))
    xt, yt = fi.load(train=False)
    ours = []
    names = [f"_r{r}" for r in range(rounds)] if args.rounds else [""]
    for c in range(len(loaders)):
      held = set(int(i) for i in loaders[c].loader.dataset.index)
      per_round = []
      for name in names:
        idx, mask = trace[f"idx{name}"], trace[f"mask{name}"]
        batches = []
        for t in range(idx.shape[0]):  # the client's batch steps, in step order
          b = idx[t, c][mask[t, c]]
          if not b.size:
            continue
          if not set(int(i) for i in b) <= held:
            sys.exit(f"trace_authors: client {c}'s batch is not in their split")
          batches.append((images(x[b], mean, std), torch.from_numpy(y[b].astype(np.int64))))
        per_round.append(batches)
      ours.append(Batches(per_round))
    return ours, val, Test(images(xt, mean, std), torch.from_numpy(yt.astype(np.int64))), how

  get_data.get_data_partition = get_data_partition

  order = [int(c) for c in trace["order"]]

  class Picks:
    """``random`` for their script: ``randint`` gives jsfl's order.  Cyclic:
    their artificial order is jsfl's.  Random: each server step's pick is
    the place in their job buffer of the client jsfl served at that step
    (``seq_r<r>``); the buffer is followed as their loop keeps it (the
    clients in id order at the round's start, a served client's next job
    appended at the end), and its size is checked against theirs."""

    def __init__(self):
      self.left = list(order)
      self.buffer, self.seq, self.batches, self.round = [], [], None, -1

    def randint(self, a, b):
      if policy != "random":
        return self.left.pop(0)
      if not self.buffer:  # a new round
        self.round += 1
        mask = trace[f"mask_r{self.round}"]
        self.batches = list(mask.any(axis=2).sum(axis=0))
        self.buffer = [c for c in range(len(self.batches)) if self.batches[c]]
        self.seq = [int(c) for c in trace[f"seq_r{self.round}"] if c >= 0]
      if b != len(self.buffer) - 1:
        sys.exit(f"trace_authors: their job buffer holds {b + 1} jobs, the trace's "
                 f"{len(self.buffer)}")
      c = self.seq.pop(0)
      i = self.buffer.index(c)
      del self.buffer[i]
      self.batches[c] -= 1
      if self.batches[c]:
        self.buffer.append(c)
      return i

    def __getattr__(self, name):
      return getattr(random, name)

  dump, count = {}, [0]
  their_step = torch.optim.SGD.step

  def step(self, *a, **k):
    result = their_step(self, *a, **k)
    server = models.get("server")
    if server is not None and any(p is next(server.parameters())
                                  for g in self.param_groups for p in g["params"]):
      count[0] += 1
      if count[0] in steps:
        snapshot(server, CUT, f"k{count[0]}:", dump)
      if steps and count[0] == max(steps):
        np.savez(out_file, **dump)
        print(f"trace_authors: {'float64' if args.f64 else 'float32'}, server after steps "
              f"{steps} -> {out_file}", flush=True)
        sys.exit(0)
    return result

  torch.optim.SGD.step = step
  their_round_start, their_record = jsfl_glue.round_start, jsfl_glue.record

  def round_start():
    their_round_start()
    current[0] = round_start.calls
    round_start.calls += 1

  round_start.calls = 0

  def record(loc):  # after their round's aggregation and evaluation
    their_record(loc)
    r = int(loc["epoch"])
    snapshot(loc["global_model_a"], 0, f"r{r}:", dump)
    snapshot(loc["global_model_bb"], CUT, f"r{r}:", dump)
    if r + 1 == rounds:
      np.savez(out_file, **dump)
      print(f"trace_authors: {'float64' if args.f64 else 'float32'}, the model after "
            f"{rounds} rounds -> {out_file}", flush=True)
      sys.exit(0)

  if args.rounds:
    jsfl_glue.round_start, jsfl_glue.record = round_start, record
  sys.argv = ["run_sfl.py"] + setting
  import run_sfl
  run_sfl.random = Picks()
  run_sfl.main()
  sys.exit("trace_authors: their round ended before the last traced step")


if __name__ == "__main__":
  main()
