"""PyTorch's MobileNetV1, ResNet-18, ResNet-101 and DenseNet-161 against
jsfl's, from shared weights.

The cross-check runs the authors' scripts on ``models/mobilenet.py`` and
``models/resnet.py``, our PyTorch ports; ``models/resnet101.py`` and
``models/densenet161.py`` port the Hydra and MultiSFL papers' larger models.
This writes what each computes in float64 from weights
both sides derive from a stage path (``shared_value``): one train-mode
forward and backward of a cross-entropy loss (the logits, the loss, every
parameter gradient as its norm and its dot product with a fixed random
vector, the running statistics it leaves as such dot products) and an eval-mode forward after it.
``tests/test_models.py::test_models_compute_pytorchs_function`` computes
the same in jsfl and compares.

Run with a Python that has torch and numpy (the authors' venv, README step 2):

    /work/authors/venv/bin/python experiments/hydra/authors_code/torch_reference.py

Writes ``tests/data/<model>_torch.npz`` (50 kB or less each) for the models
named on the command line, or for all of them:

    .../python experiments/hydra/authors_code/torch_reference.py resnet101 densenet161

``mobilenet_v1``'s and ``resnet18``'s files hold one entry per parameter
(``grad_norm:<path>`` ...); ``resnet101``'s and ``densenet161``'s pack those
into arrays beside their paths (``grad_norm`` and ``param_paths`` ...), as a
zip entry costs about 200 bytes and DenseNet-161 has 484 parameters;
:func:`read` gives either layout as the first.  This module imports only
numpy at its top: the test takes ``shared_value``, ``batch`` and ``read``
from it.
"""

from __future__ import annotations

import os
import sys
import types
import zlib

import numpy as np

# jsfl name -> width; the deep models at full depth, narrow to keep the
# test's float64 programs quick to compile and run
MODELS = {"mobilenet_v1": 0.25, "resnet18": 0.125, "resnet101": 0.125, "densenet161": 0.125}
SHAPE = (28, 28, 1)  # Fashion-MNIST: every stride-2 layer meets an even size
NUM_CLASSES = 10
# the input each model's papers give it, where it is not SHAPE's: CIFAR for
# ResNet-101 (Hydra), TinyImageNet for DenseNet-161 (MultiSFL)
SHAPES = {"resnet101": (32, 32, 3), "densenet161": (64, 64, 3)}
CLASSES = {"densenet161": 200}
PACKED = ("resnet101", "densenet161")  # written in the packed layout
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


def input_shape(name: str) -> tuple[int, int, int]:
  """``(H, W, C)`` of the model's reference batch."""
  return SHAPES.get(name, SHAPE)


def num_classes(name: str) -> int:
  return CLASSES.get(name, NUM_CLASSES)


def batch(name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """NHWC images and labels (of the model ``name``, default SHAPE's)."""
  x = np.random.default_rng(0).standard_normal((N,) + (input_shape(name) if name else SHAPE))
  y = np.random.default_rng(1).integers(0, num_classes(name) if name else NUM_CLASSES, N)
  return x, y


def read(path) -> dict:
  """A reference file as ``{"logits_train", "loss", "logits_eval",
  "grad_norm:<path>", "grad_dot:<path>", "stat_dot:<path>"}``, whichever
  layout it was written in."""
  with np.load(path) as f:
    data = {k: f[k] for k in f.files}
  if "param_paths" not in data:
    return data
  out = {k: data[k] for k in ("logits_train", "loss", "logits_eval")}
  for kind, paths in (("grad_norm", "param_paths"), ("grad_dot", "param_paths"),
                      ("stat_dot", "stat_paths")):
    out.update({f"{kind}:{p}": v for p, v in zip(data[paths], data[kind], strict=True)})
  return out


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
  elif name == "resnet18":
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
  elif name == "resnet101":
    from models.resnet101 import stages
    st = stages(input_shape(name)[2], num_classes(name), MODELS[name])
    _conv(params, "0", st[0])
    _bn(params, stats, "1/norm", st[1][0])
    for i, b in enumerate(st[2:-2], start=2):
      for k in (1, 2, 3):
        _conv(params, f"{i}/conv{k}", getattr(b, f"conv{k}"))
        _bn(params, stats, f"{i}/norm{k}", getattr(b, f"norm{k}"))
      if b.proj is not None:
        _conv(params, f"{i}/proj", b.proj[0])
        _bn(params, stats, f"{i}/proj_norm", b.proj[1])
    _linear(params, f"{len(st) - 1}/linear", st[-1])
  else:
    from models.densenet161 import DenseLayer, stages
    st = stages(input_shape(name)[2], num_classes(name), MODELS[name])
    _conv(params, "0/conv", st[0][0])
    _bn(params, stats, "0/norm", st[0][1])
    for i, s in enumerate(st[1:-2], start=1):
      if isinstance(s, DenseLayer):
        for k in (1, 2):
          _bn(params, stats, f"{i}/norm{k}", getattr(s, f"norm{k}"))
          _conv(params, f"{i}/conv{k}", getattr(s, f"conv{k}"))
      else:  # transition: BN - relu - conv1x1 - avgpool
        _bn(params, stats, f"{i}/norm", s[0])
        _conv(params, f"{i}/conv", s[2])
    _bn(params, stats, f"{len(st) - 2}/norm", st[-2][0])
    _linear(params, f"{len(st) - 1}/dense/linear", st[-1].fc)
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
  x, y = batch(name)
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
  net.train()
  logits = net(xt)
  loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
  loss.backward()
  out = {"logits_train": logits.detach().numpy(), "loss": loss.item()}
  for path, (t, jshape, perm) in params.items():
    g = t.grad.numpy()
    g = g.transpose(np.argsort(perm)) if perm else g
    out[f"grad_norm:{path}"] = np.linalg.norm(g)
    out[f"grad_dot:{path}"] = np.sum(g * projection(path, jshape))
  for path, (t, jshape, _) in stats.items():
    out[f"stat_dot:{path}"] = np.sum(t.detach().numpy() * projection(path, jshape))
  net.eval()
  with torch.no_grad():
    out["logits_eval"] = net(xt).numpy()
  if name in PACKED:
    out = _packed(out, list(params), list(stats))
  out_file = os.path.normpath(os.path.join(DATA, f"{name}_torch.npz"))
  os.makedirs(DATA, exist_ok=True)
  np.savez_compressed(out_file, **out)
  print(f"{name} (torch {torch.__version__}): loss {out['loss']:.12f}, {len(params)} "
        f"parameters -> {out_file}")


def _packed(out: dict, param_paths: list, stat_paths: list) -> dict:
  """``out`` with its per-path scalars as arrays beside their paths."""
  packed = {k: out[k] for k in ("logits_train", "loss", "logits_eval")}
  packed["param_paths"], packed["stat_paths"] = np.array(param_paths), np.array(stat_paths)
  for kind, paths in (("grad_norm", param_paths), ("grad_dot", param_paths),
                      ("stat_dot", stat_paths)):
    packed[kind] = np.array([out[f"{kind}:{p}"] for p in paths])
  return packed


if __name__ == "__main__":
  for model in sys.argv[1:] or MODELS:
    if model not in MODELS:
      sys.exit(f"torch_reference: model {model!r}; allowed: {', '.join(MODELS)}")
    write(model)
