"""Layer initialisation schemes of the model zoo.

* ``"torch"`` (the default): what PyTorch's layers draw when a model does not
  initialise them itself, which is what the papers' reference code ran:
  convolution and dense weights uniform in ``+-1/sqrt(fan_in)`` (PyTorch's
  ``kaiming_uniform_(a=sqrt(5))``), their biases uniform in the same
  interval, normalisation scales 1 and shifts 0.  ``fan_in`` is
  ``kh * kw * cin / groups`` for a convolution (``kh * kw`` for a depthwise
  one) and the input width for a dense layer.
* ``"he_lecun"``: the zoo's own draws: He-normal convolutions, LeCun-normal
  dense layers (Flax's default), zero biases.

See [docs/models.md](../../docs/models.md#initialisation).
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from jsfl.models import layers

INITS = ("torch", "he_lecun")


def _uniform(key, var, bound):
  var[...] = jax.random.uniform(key, var[...].shape, var[...].dtype, -bound, bound)


def torch_init(module: nnx.Module, key: jax.Array) -> None:
  """Redraws, in place, every weight and bias of ``module`` as PyTorch's
  default initialisation does.

  Raises:
    TypeError: for a parameter outside the layers it knows (a new layer type
      needs its rule here, not a silent default).
  """
  done: set[int] = set()
  k = 0
  for _, node in nnx.iter_graph(module):
    if isinstance(node, (layers.Conv, layers.DepthwiseConv)):
      kernel, bias = node.kernel, getattr(node, "bias", None)
      fan_in = math.prod(kernel[...].shape[:-1])  # (kh, kw, cin or 1, cout)
    elif isinstance(node, nnx.Linear):
      kernel, bias = node.kernel, node.bias
      fan_in = kernel[...].shape[0]
    elif isinstance(node, (layers.BatchNorm, nnx.BatchNorm, nnx.GroupNorm, nnx.LayerNorm)):
      done.update(id(v) for v in (node.scale, node.bias) if v is not None)
      continue  # ones and zeros, as PyTorch's
    else:
      continue
    bound = 1.0 / math.sqrt(fan_in)
    for var in (kernel, bias):
      if var is not None:
        _uniform(jax.random.fold_in(key, k), var, bound)
        done.add(id(var))
        k += 1
  for path, node in nnx.iter_graph(module):
    if isinstance(node, nnx.Param) and id(node) not in done:
      raise TypeError(f"init='torch': no rule for parameter {'.'.join(map(str, path))} "
                      f"of {type(module).__name__}")


def apply(scheme: str, stages, key: jax.Array) -> None:
  """Initialises freshly built ``stages`` by ``scheme`` (in place)."""
  if scheme == "he_lecun":
    return
  if scheme != "torch":
    raise ValueError(f"init={scheme!r}; allowed: {', '.join(INITS)}")
  for i, stage in enumerate(stages):
    torch_init(stage, jax.random.fold_in(key, i))
