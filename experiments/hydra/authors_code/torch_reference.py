"""PyTorch's MobileNetV1 and ResNet-18 against jsfl's, from shared weights.

The cross-check runs the authors' scripts on ``models/mobilenet.py`` and
``models/resnet.py``, our PyTorch ports; this writes what each computes in
float64 from weights
both sides derive from a stage path (``shared_value``): one train-mode
forward and backward of a cross-entropy loss (the logits, the loss, every
parameter gradient as its norm and its dot product with a fixed random
vector, the running statistics it leaves as such dot products) and an eval-mode forward after it.
``tests/test_models.py::test_models_compute_pytorchs_function`` computes
the same in jsfl and compares.

Run with a Python that has torch and numpy (the authors' venv, README step 2):

    /work/authors/venv/bin/python experiments/hydra/authors_code/torch_reference.py

Writes ``tests/data/<model>_torch.npz`` (about 50 kB each).  This module
imports only numpy at its top: the test takes ``shared_value`` and ``batch``
from it.
"""

from __future__ import annotations

import os
import sys
import types
import zlib

import numpy as np

MODELS = {"mobilenet_v1": 0.25, "resnet18": 0.125}  # jsfl name -> width
SHAPE = (28, 28, 1)  # Fashion-MNIST: every stride-2 layer meets an even size
NUM_CLASSES = 10
N = 4
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data")


def shared_value(path: str, shape) -> np.ndarray:
  """The value of jsfl's parameter or statistic ``path`` ("stage/.../leaf",
  jsfl's layout), a function of the path alone: He-normal kernels, scales and
  running variances near 1, biases and running means near 0."""
  z = np.random.default_rng(zlib.crc32(path.encode())).standard_normal(shape)
  leaf = path.rsplit("/", 1)[-1]
  if leaf == "kernel":
    return z * np.sqrt(2.0 / np.prod(shape[:-1]))
  if leaf in ("scale", "var"):
    return 1.0 + 0.1 * np.abs(z)
  return 0.1 * z


def projection(path: str, shape) -> np.ndarray:
  """A fixed random direction per parameter (a gradient's fingerprint)."""
  return np.random.default_rng(zlib.crc32(("projection:" + path).encode())).standard_normal(shape)


def batch() -> tuple[np.ndarray, np.ndarray]:
  """NHWC images and labels."""
  x = np.random.default_rng(0).standard_normal((N,) + SHAPE)
  y = np.random.default_rng(1).integers(0, NUM_CLASSES, N)
  return x, y


def _conv(table, path, conv):
  o, ig, kh, kw = conv.weight.shape
  table[f"{path}/kernel"] = (conv.weight, (kh, kw, ig, o), (3, 2, 0, 1))


def _bn(params, stats, path, bn):
  n = bn.weight.shape
  params[f"{path}/norm/scale"] = (bn.weight, n, None)
  params[f"{path}/norm/bias"] = (bn.bias, n, None)
  stats[f"{path}/norm/mean"] = (bn.running_mean, n, None)
  stats[f"{path}/norm/var"] = (bn.running_var, n, None)


def _linear(table, path, fc):
  table[f"{path}/kernel"] = (fc.weight, tuple(fc.weight.shape[::-1]), (1, 0))
  table[f"{path}/bias"] = (fc.bias, tuple(fc.bias.shape), None)


def _torch_model(name: str):
  """The port's stages and, per jsfl path, its tensor, jsfl's shape and the
  axis order from jsfl's layout to PyTorch's."""
  import torch

  # the ports import jsfl_glue (the clone's) for a width this passes itself
  sys.modules.setdefault("jsfl_glue", types.SimpleNamespace(WIDTH=1.0))
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  params, stats = {}, {}
  if name == "mobilenet_v1":
    from models.mobilenet import stages
    st = stages(SHAPE[2], NUM_CLASSES, MODELS[name])
    for i, s in enumerate(st[:-1]):  # conv - BN - relu
      _conv(params, f"{i}/conv", s[0])
      _bn(params, stats, f"{i}/norm", s[1])
    _linear(params, f"{len(st) - 1}/dense/linear", st[-1].fc)
  else:
    from models.resnet import stages
    st = stages(SHAPE[2], NUM_CLASSES, MODELS[name])
    _conv(params, "0", st[0])
    _bn(params, stats, "1/norm", st[1][0])
    for i, b in enumerate(st[2:10], start=2):
      _conv(params, f"{i}/conv1", b.conv1)
      _bn(params, stats, f"{i}/norm1", b.norm1)
      _conv(params, f"{i}/conv2", b.conv2)
      _bn(params, stats, f"{i}/norm2", b.norm2)
      if b.proj is not None:
        _conv(params, f"{i}/proj", b.proj[0])
        _bn(params, stats, f"{i}/proj_norm", b.proj[1])
    _linear(params, "11/linear", st[11])
  net = torch.nn.Sequential(*st).double()
  with torch.no_grad():
    for table in (params, stats):
      for path, (t, shape, perm) in table.items():
        v = shared_value(path, shape)
        t.copy_(torch.from_numpy(v.transpose(perm) if perm else v))
  return net, params, stats


def write(name: str) -> None:
  import torch

  torch.set_default_dtype(torch.float64)
  net, params, stats = _torch_model(name)
  x, y = batch()
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  net.train()
  logits = net(xt)
  loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
  loss.backward()
  out = {"logits_train": logits.detach().numpy(), "loss": loss.item()}
  for path, (t, shape, perm) in params.items():
    g = t.grad.numpy()
    g = g.transpose(np.argsort(perm)) if perm else g
    out[f"grad_norm:{path}"] = np.linalg.norm(g)
    out[f"grad_dot:{path}"] = np.sum(g * projection(path, shape))
  for path, (t, shape, _) in stats.items():
    out[f"stat_dot:{path}"] = np.sum(t.detach().numpy() * projection(path, shape))
  net.eval()
  with torch.no_grad():
    out["logits_eval"] = net(xt).numpy()
  out_file = os.path.normpath(os.path.join(DATA, f"{name}_torch.npz"))
  os.makedirs(DATA, exist_ok=True)
  np.savez_compressed(out_file, **out)
  print(f"{name} (torch {torch.__version__}): loss {out['loss']:.12f}, {len(params)} "
        f"parameters -> {out_file}")


if __name__ == "__main__":
  for model in MODELS:
    write(model)
