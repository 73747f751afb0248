"""PyTorch's MobileNetV1 against jsfl's ``mobilenet_v1``, from shared weights.

The cross-check runs the authors' scripts on ``models/mobilenet.py``, our
PyTorch port; this writes what that port computes in float64 from weights
both sides derive from a stage path (``shared_value``): one train-mode
forward and backward of a cross-entropy loss (the logits, the loss, every
parameter gradient as its norm and its dot product with a fixed random
vector, the running statistics it leaves as such dot products) and an eval-mode forward after it.
``tests/test_models.py::test_mobilenet_v1_computes_pytorchs_function``
computes the same in jsfl and compares.

Run with a Python that has torch and numpy (the authors' venv, README step 2):

    /work/authors/venv/bin/python experiments/hydra/authors_code/torch_reference.py

Writes ``tests/data/mobilenet_v1_torch.npz`` (about 50 kB).  This module
imports only numpy at its top: the test takes ``shared_value`` and ``batch``
from it.
"""

from __future__ import annotations

import os
import sys
import types
import zlib

import numpy as np

WIDTH = 0.25
SHAPE = (28, 28, 1)  # Fashion-MNIST: every stride-2 layer meets an even size
NUM_CLASSES = 10
N = 4
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data",
                   "mobilenet_v1_torch.npz")


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


def _torch_model():
  import torch

  sys.modules.setdefault("jsfl_glue", types.SimpleNamespace(WIDTH=WIDTH))
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from models.mobilenet import stages

  st = stages(SHAPE[2], NUM_CLASSES, WIDTH)
  params, stats = {}, {}  # jsfl path -> (torch tensor, jsfl -> torch layout)
  for i, s in enumerate(st[:-1]):
    conv, bn = s[0], s[1]
    o, ig, kh, kw = conv.weight.shape
    params[f"{i}/conv/kernel"] = (conv.weight, (kh, kw, ig, o), (3, 2, 0, 1))
    params[f"{i}/norm/norm/scale"] = (bn.weight, (o,), None)
    params[f"{i}/norm/norm/bias"] = (bn.bias, (o,), None)
    stats[f"{i}/norm/norm/mean"] = (bn.running_mean, (o,), None)
    stats[f"{i}/norm/norm/var"] = (bn.running_var, (o,), None)
  fc = st[-1].fc
  last = len(st) - 1
  params[f"{last}/dense/linear/kernel"] = (fc.weight, tuple(fc.weight.shape[::-1]), (1, 0))
  params[f"{last}/dense/linear/bias"] = (fc.bias, tuple(fc.bias.shape), None)
  net = torch.nn.Sequential(*st).double()
  with torch.no_grad():
    for table in (params, stats):
      for path, (t, shape, perm) in table.items():
        v = shared_value(path, shape)
        t.copy_(torch.from_numpy(v.transpose(perm) if perm else v))
  return net, params, stats


def main() -> None:
  import torch

  torch.set_default_dtype(torch.float64)
  net, params, stats = _torch_model()
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
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  np.savez_compressed(OUT, **out)
  print(f"torch {torch.__version__}: loss {out['loss']:.12f}, {len(params)} parameters -> "
        f"{os.path.normpath(OUT)}")


if __name__ == "__main__":
  main()
