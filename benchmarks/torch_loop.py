"""The papers' way of running split FL: PyTorch, per-client Python loops.

A baseline for ``benchmarks/vs_torch.py``, written for this repository (no
code copied from the papers' repositories).  One process, eager PyTorch, one
Python call per client batch, as the reference implementations of SplitFed,
Hydra and MultiSFL run:

* **SFL** (SplitFedV2, sequential server): each round every participating
  client starts from the global part-1 (its own module, reloaded); for each
  batch step and each client in that step's random processing order: client
  forward, server forward / backward / SGD step on the one part-2, the
  cut-layer gradient back to the client, client backward and SGD step.  Round
  end: sample-weighted FedAvg of the part-1 copies (parameters and BatchNorm
  buffers).
* **Hydra**: the same, the server step goes through the shared part-2a and
  the head of the client's group (G heads of part-2b at the head cut); round
  end also averages the heads uniformly and copies the mean into every head.
* **MultiSFL** (KoReA-SFL): n branches, each with its own client and server
  portion; the branches are trained one after another, each on its main
  client's batches; round end: master = uniform mean of the branches, then
  pull-back ``w_i <- (w_i + alpha w) / (1 + alpha)``.  Knowledge replay is
  left out (the paper's ablation Conf1, jsfl's ``replay="off"``); the server
  gradients are still summed per branch for FGN, as jsfl's round does.

The models mirror jsfl's CIFAR MobileNetV1 and ResNet-18 stage for stage
(``jsfl/models/mobilenet_v1.py``, ``jsfl/models/resnet18.py``): the same
stages, widths (``width`` multiplier, ``max(1, int(c * width))``), BatchNorm
after every convolution (eps 1e-5, PyTorch momentum 0.1 = jsfl's 0.9),
convolutions without bias, and the same default cut indices, so a cut ``c``
gives the client stages ``[0, c)``.  One difference that does not change the
work: PyTorch pads a stride-2 3x3 convolution (1, 1) where jsfl's SAME pads
(0, 1); output shapes and FLOPs are equal.

The loop is a favourable version of the reference code: the whole training
set sits on the device as uint8 and a batch is a slice of one shuffled index
table per round (no DataLoader, no host-to-device copy per batch), and the
loss is accumulated on the device (no ``.item()`` sync per step).  Optimiser:
``torch.optim.SGD`` with momentum and weight decay as jsfl's
``make_optimizer``; client optimisers are rebuilt every round, server
ones persist (docs/setting.md#optimisation, as in jsfl).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interleave  # benchmarks/ is not a package: a sibling module

# (channels, stride) of jsfl's MobileNetV1 separable blocks and ResNet-18
# BasicBlocks (jsfl/models/mobilenet_v1.py BLOCKS, jsfl/models/resnet18.py
# BLOCKS).
MOBILENET_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2),
                    (1024, 1))
RESNET_BLOCKS = ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1),
                 (512, 2), (512, 1))
# jsfl's defaults: (cut, Hydra head cut) per model.
DEFAULT_CUTS = {"mobilenet_v1": (4, 26), "resnet18": (4, 10)}
MODELS = tuple(DEFAULT_CUTS)
METHODS = ("sfl", "hydra", "multisfl")


# ------------------------------------------------------------------ models
class ConvNormRelu(nn.Sequential):
  """conv (no bias) - BatchNorm - relu; ``groups=cin`` makes it depthwise."""

  def __init__(self, cin, cout, kernel, stride=1, groups=1):
    super().__init__(
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Classifier(nn.Module):
  """Global average pool - linear (MobileNetV1's stage 27)."""

  def __init__(self, din, num_classes):
    super().__init__()
    self.fc = nn.Linear(din, num_classes)

  def forward(self, x):
    return self.fc(x.mean((2, 3)))


class BasicBlock(nn.Module):
  """Two 3x3 convs with an identity or 1x1-projection shortcut."""

  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.norm1 = nn.BatchNorm2d(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.norm2 = nn.BatchNorm2d(cout)
    self.proj = None
    if stride != 1 or cin != cout:
      self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                nn.BatchNorm2d(cout))

  def forward(self, x):
    y = F.relu(self.norm1(self.conv1(x)))
    y = self.norm2(self.conv2(y))
    return F.relu((x if self.proj is None else self.proj(x)) + y)


class GlobalAvgPool(nn.Module):
  def forward(self, x):
    return x.mean((2, 3))


def mobilenet_v1_stages(num_classes: int, width: float = 1.0, cin: int = 3):
  """jsfl's 28 MobileNetV1 stages: stem, (dw_k, pw_k) x 13, classifier."""
  ch = lambda c: max(1, int(c * width))
  stages = [ConvNormRelu(cin, ch(32), 3)]
  c = ch(32)
  for cout, stride in MOBILENET_BLOCKS:
    stages += [ConvNormRelu(c, c, 3, stride, groups=c), ConvNormRelu(c, ch(cout), 1)]
    c = ch(cout)
  return stages + [Classifier(c, num_classes)]


def resnet18_stages(num_classes: int, width: float = 1.0, cin: int = 3):
  """jsfl's 12 ResNet-18 stages: conv1, bn1, block1..8, avgpool, fc."""
  ch = lambda c: max(1, int(c * width))
  stages = [nn.Conv2d(cin, ch(64), 3, 1, 1, bias=False),
            nn.Sequential(nn.BatchNorm2d(ch(64)), nn.ReLU(inplace=True))]
  c = ch(64)
  for cout, stride in RESNET_BLOCKS:
    stages.append(BasicBlock(c, ch(cout), stride))
    c = ch(cout)
  return stages + [GlobalAvgPool(), nn.Linear(c, num_classes)]


def build_stages(name: str, num_classes: int = 10, width: float = 1.0, cin: int = 3):
  """The stage list of ``name`` (one of ``MODELS``)."""
  if name == "mobilenet_v1":
    return mobilenet_v1_stages(num_classes, width, cin)
  if name == "resnet18":
    return resnet18_stages(num_classes, width, cin)
  raise ValueError(f"model={name!r}; allowed: {MODELS}")


# ----------------------------------------------------------------- helpers
@dataclasses.dataclass
class Config:
  """A torch-loop run, mirroring the fields of jsfl's ``core.setup.Setup``.

  Attributes:
    model: one of ``MODELS``.
    num_clients: K (every client participates: n = K).
    batch_size: B.
    width: channel multiplier.
    cut: part-1 / part-2 cut (None: jsfl's default).
    head_cut: Hydra's part-2a / heads cut (None: jsfl's default).
    lr, momentum, weight_decay: SGD as in jsfl's ``make_optimizer``.
    groups: Hydra's client -> group list (None: client k in group k % 10).
    alpha: MultiSFL pull-back weight.
    channels_last: run the convolutions in NHWC memory format.
    num_classes: output width.
  """

  model: str
  num_clients: int
  batch_size: int = 64
  width: float = 1.0
  cut: int | None = None
  head_cut: int | None = None
  lr: float = 0.01
  momentum: float = 0.0
  weight_decay: float = 0.0
  groups: tuple | None = None
  alpha: float = 0.1
  channels_last: bool = False
  num_classes: int = 10

  def cuts(self) -> tuple[int, int]:
    c, h = DEFAULT_CUTS[self.model]
    return (c if self.cut is None else self.cut,
            h if self.head_cut is None else self.head_cut)


class Data:
  """Device-resident uint8 train set and the clients' index table.

  Args:
    x: ``(N, H, W, C)`` uint8 images (jsfl's layout; stored here as NCHW).
    y: ``(N,)`` labels.
    mean, std: ``(C,)`` per-channel statistics of ``x / 255``.
    table: ``(K, M)`` sample indices of every client (all rows full).
    device: torch device.
    channels_last: give batches in NHWC memory format.
  """

  def __init__(self, x, y, mean, std, table, device, channels_last=False):
    # Copies: jsfl's dataset arrays are read-only, torch wants writable ones.
    self.x = torch.tensor(np.asarray(x)).permute(0, 3, 1, 2).contiguous().to(device)
    self.y = torch.tensor(np.asarray(y)).long().to(device)
    self.mean = torch.tensor(np.asarray(mean), dtype=torch.float32).view(1, -1, 1, 1).to(device)
    self.std = torch.tensor(np.asarray(std), dtype=torch.float32).view(1, -1, 1, 1).to(device)
    self.table = torch.tensor(np.asarray(table)).long().to(device)
    self.device, self.channels_last = device, channels_last

  def shuffled(self, gen) -> torch.Tensor:
    """``(K, M)`` every client's samples in a fresh random order (one epoch)."""
    u = torch.rand(self.table.shape, generator=gen, device=self.device)
    return self.table.gather(1, u.argsort(1))

  def batch(self, idx):
    """Normalised float inputs and labels of an index vector."""
    x = (self.x[idx].float() / 255.0 - self.mean) / self.std
    if self.channels_last:
      x = x.contiguous(memory_format=torch.channels_last)
    return x, self.y[idx]


def _module(stages, cfg: Config, device) -> nn.Sequential:
  m = nn.Sequential(*stages).to(device)
  return m.to(memory_format=torch.channels_last) if cfg.channels_last else m


def _sgd(modules, cfg: Config):
  params = [p for m in modules for p in m.parameters()]
  return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                         weight_decay=cfg.weight_decay)


@torch.no_grad()
def average_into(targets, sources, weights=None):
  """FedAvg: every module of ``targets`` gets the weighted mean of ``sources``.

  Parameters and floating-point buffers (BatchNorm running statistics) are
  averaged; integer buffers (``num_batches_tracked``) take the first source's.
  """
  if weights is None:
    weights = [1.0] * len(sources)
  total = float(sum(weights))
  w = [float(v) / total for v in weights]
  states = [s.state_dict() for s in sources]
  mean = {}
  for k, v in states[0].items():
    if v.is_floating_point():
      acc = v * w[0]
      for sd, wi in zip(states[1:], w[1:]):
        acc.add_(sd[k], alpha=wi)
      mean[k] = acc
    else:
      mean[k] = v.clone()
  for t in targets:
    t.load_state_dict(mean)


def _seed(seed: int, device):
  """Seeds torch's global state (model init) and returns the round's
  generators on ``device`` and on the CPU."""
  torch.manual_seed(seed)
  gen = torch.Generator(device=device)
  gen.manual_seed(seed)
  cpu_gen = torch.Generator()
  cpu_gen.manual_seed(seed)
  return gen, cpu_gen


def _split_step(client, opt_c, x, y, serve):
  """One client batch: client forward, the server's update, client backward.

  ``serve(act) -> loss`` runs the server's forward, backward and SGD step on
  the detached cut-layer activation (the upload) and leaves its gradient
  (the download) in ``act.grad``.
  """
  a = client(x)
  up = a.detach().requires_grad_()
  loss = serve(up, y)
  opt_c.zero_grad(set_to_none=True)
  a.backward(up.grad)
  opt_c.step()
  return loss.detach()


# ----------------------------------------------------------------- methods
class SFL:
  """SplitFedV2 with a sequential server (random processing order).

  Args:
    cfg: the run.
    data: the workload.
    seed: seeds the initial model and the round's randomness.
  """

  def __init__(self, cfg: Config, data: Data, seed: int):
    self.cfg, self.data = cfg, data
    dev = data.device
    self.gen, self.cpu_gen = _seed(seed, dev)
    stages = build_stages(cfg.model, cfg.num_classes, cfg.width,
                          int(data.x.shape[1]))
    cut, _ = cfg.cuts()
    self.part1 = _module(stages[:cut], cfg, dev)
    self._build_server(stages[cut:])
    # The clients' part-1 copies; reloaded from the global one every round.
    self.clients = [_module(build_stages(cfg.model, cfg.num_classes, cfg.width,
                                         int(data.x.shape[1]))[:cut], cfg, dev)
                    for _ in range(cfg.num_clients)]
    self.sizes = [int(data.table.shape[1])] * cfg.num_clients

  def _build_server(self, stages):
    self.part2 = _module(stages, self.cfg, self.data.device)
    self.opt2 = _sgd([self.part2], self.cfg)

  def serve(self, c: int, act, y):
    """Server forward, backward and SGD step on client ``c``'s upload."""
    loss = F.cross_entropy(self.part2(act), y)
    self.opt2.zero_grad(set_to_none=True)
    loss.backward()
    self.opt2.step()
    return loss

  def _end_round(self):
    average_into([self.part1], self.clients, self.sizes)

  def round(self) -> torch.Tensor:
    """One round; returns the summed batch losses (a device scalar)."""
    B, K = self.cfg.batch_size, self.cfg.num_clients
    gsd = self.part1.state_dict()
    for m in self.clients:
      m.load_state_dict(gsd)
    opts = [_sgd([m], self.cfg) for m in self.clients]
    idx = self.data.shuffled(self.gen)
    steps = math.ceil(idx.shape[1] / B)
    total = torch.zeros((), device=self.data.device)
    for t in range(steps):
      for c in torch.randperm(K, generator=self.cpu_gen).tolist():
        x, y = self.data.batch(idx[c, t * B:(t + 1) * B])
        total += _split_step(self.clients[c], opts[c], x, y,
                             lambda a, yy, c=c: self.serve(c, a, yy))
    self._end_round()
    return total


class Hydra(SFL):
  """SFL with a shared part-2a and G heads (one per group) at the head cut."""

  def _build_server(self, stages):
    cfg, dev = self.cfg, self.data.device
    cut, hc = cfg.cuts()
    groups = cfg.groups or tuple(k % cfg.num_classes for k in range(cfg.num_clients))
    self.group = list(groups)
    G = max(self.group) + 1
    self.part2a = _module(stages[:hc - cut], cfg, dev)
    head = _module(stages[hc - cut:], cfg, dev)
    # Every head starts from the same weights, as jsfl's init broadcasts one.
    self.heads = [head] + [_module(build_stages(
        cfg.model, cfg.num_classes, cfg.width, int(self.data.x.shape[1]))[hc:], cfg, dev)
        for _ in range(G - 1)]
    for h in self.heads[1:]:
      h.load_state_dict(head.state_dict())
    self.opt2a = _sgd([self.part2a], cfg)
    self.opt_heads = [_sgd([h], cfg) for h in self.heads]

  def serve(self, c: int, act, y):
    g = self.group[c]
    loss = F.cross_entropy(self.heads[g](self.part2a(act)), y)
    self.opt2a.zero_grad(set_to_none=True)
    self.opt_heads[g].zero_grad(set_to_none=True)
    loss.backward()
    self.opt2a.step()
    self.opt_heads[g].step()
    return loss

  def _end_round(self):
    super()._end_round()
    average_into(self.heads, self.heads)


class MultiSFL:
  """MultiSFL without knowledge replay (Conf1): n branches, master + pull-back.

  Args:
    cfg: the run (``num_clients`` = n branches, every client a main client).
    data: the workload.
    seed: seeds the initial model and the round's randomness.
  """

  def __init__(self, cfg: Config, data: Data, seed: int):
    self.cfg, self.data = cfg, data
    dev = data.device
    self.gen, self.cpu_gen = _seed(seed, dev)
    cut, _ = cfg.cuts()
    cin = int(data.x.shape[1])
    first = build_stages(cfg.model, cfg.num_classes, cfg.width, cin)
    self.wc = [_module(first[:cut], cfg, dev)]
    self.ws = [_module(first[cut:], cfg, dev)]
    for _ in range(cfg.num_clients - 1):
      # All branches start from one model, as the authors deep-copy one.
      s = build_stages(cfg.model, cfg.num_classes, cfg.width, cin)
      self.wc.append(_module(s[:cut], cfg, dev))
      self.ws.append(_module(s[cut:], cfg, dev))
      self.wc[-1].load_state_dict(self.wc[0].state_dict())
      self.ws[-1].load_state_dict(self.ws[0].state_dict())
    self.opt_s = [_sgd([m], cfg) for m in self.ws]

  @torch.no_grad()
  def _pull_back(self, branches):
    alpha = self.cfg.alpha
    states = [b.state_dict() for b in branches]
    for k, v in states[0].items():
      if not v.is_floating_point():
        continue
      master = torch.stack([sd[k] for sd in states]).mean(0)
      for sd in states:
        sd[k].add_(master, alpha=alpha).div_(1.0 + alpha)

  def round(self) -> torch.Tensor:
    """One round; returns the summed batch losses (a device scalar)."""
    B, n = self.cfg.batch_size, self.cfg.num_clients
    idx = self.data.shuffled(self.gen)
    steps = math.ceil(idx.shape[1] / B)
    main = torch.randperm(n, generator=self.cpu_gen).tolist()
    total = torch.zeros((), device=self.data.device)
    fgn = torch.zeros((), device=self.data.device)
    for i in range(n):
      wc, ws, opt_s = self.wc[i], self.ws[i], self.opt_s[i]
      opt_c = _sgd([wc], self.cfg)
      gsum = [torch.zeros_like(p) for p in ws.parameters()]

      def serve(a, y, ws=ws, opt_s=opt_s, gsum=gsum):
        loss = F.cross_entropy(ws(a), y)
        opt_s.zero_grad(set_to_none=True)
        loss.backward()
        # The summed server gradients give FGN (Eq. 5), as in jsfl's round.
        torch._foreach_add_(gsum, [p.grad for p in ws.parameters()])
        opt_s.step()
        return loss

      for t in range(steps):
        x, y = self.data.batch(idx[main[i], t * B:(t + 1) * B])
        total += _split_step(wc, opt_c, x, y, serve)
      fgn += -self.cfg.lr * sum((g / steps).square().sum() for g in gsum) / n
    self._pull_back(self.wc)
    self._pull_back(self.ws)
    return total


def make(method: str, cfg: Config, data: Data, seed: int):
  """The torch-loop runner of ``method`` (one of ``METHODS``) for one seed."""
  if method == "sfl":
    return SFL(cfg, data, seed)
  if method == "hydra":
    return Hydra(cfg, data, seed)
  if method == "multisfl":
    return MultiSFL(cfg, data, seed)
  raise ValueError(f"method={method!r}; allowed: {METHODS}")


def central_step(cfg: Config, device, steps: int):
  """``steps`` whole-model SGD steps at batch ``cfg.batch_size`` (no split).

  The kernels' speed without any split-learning structure: the reference
  point for how far jax's and torch's convolutions are apart.
  """
  net = _module(build_stages(cfg.model, cfg.num_classes, cfg.width), cfg, device)
  opt = _sgd([net], cfg)
  x = torch.randn(cfg.batch_size, 3, 32, 32, device=device)
  if cfg.channels_last:
    x = x.contiguous(memory_format=torch.channels_last)
  y = torch.randint(0, cfg.num_classes, (cfg.batch_size,), device=device)

  def call():
    for _ in range(steps):
      loss = F.cross_entropy(net(x), y)
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()

  return call


def main(argv=None):
  """Worker of ``benchmarks/vs_torch.py`` (see ``benchmarks/interleave.py``).

  ``--serve SPEC``: a JSON object with ``what`` (``"round"`` or
  ``"central"``), ``method``, ``seeds``, ``data`` (an ``.npz`` with ``x``,
  ``y``, ``mean``, ``std``, ``table``), ``device``, ``threads``,
  ``central_steps`` and ``config`` (the :class:`Config` fields).
  """
  ap = argparse.ArgumentParser(description="torch-loop benchmark worker")
  ap.add_argument("--serve", required=True, help="JSON spec")
  spec = json.loads(ap.parse_args(argv).serve)
  torch.set_num_threads(spec["threads"])
  device = torch.device(spec["device"])
  cfg = Config(**spec["config"])
  if spec["what"] == "central":
    step = central_step(cfg, device, spec["central_steps"])
    runners = []
  else:
    d = np.load(spec["data"])
    data = Data(d["x"], d["y"], d["mean"], d["std"], d["table"], device, cfg.channels_last)
    runners = [make(spec["method"], cfg, data, s) for s in range(spec["seeds"])]

  def call():
    # Seeds one after another, as the papers' code runs several seeds.
    if runners:
      for r in runners:
        r.round()
    else:
      step()
    if device.type == "cuda":
      torch.cuda.synchronize()

  def memory():
    if device.type == "cuda":
      return {"kind": "torch.cuda.max_memory_allocated",
              "peak_bytes": torch.cuda.max_memory_allocated()}
    return {"kind": "worker process peak RSS", "peak_bytes": interleave.rss_peak_bytes()}

  interleave.serve(call, {"threads": torch.get_num_threads(),
                          "channels_last": cfg.channels_last}, memory)


if __name__ == "__main__":
  main()
