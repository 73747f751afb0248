"""Layer initialisation schemes of the model zoo.

* ``"torch"`` (the default): what PyTorch's layers draw when a model does not
  initialise them itself, which is what the papers' reference code ran
  wherever its models do not initialise themselves:
  convolution and dense weights uniform in ``+-1/sqrt(fan_in)`` (PyTorch's
  ``kaiming_uniform_(a=sqrt(5))``), their biases uniform in the same
  interval, normalisation scales 1 and shifts 0.  ``fan_in`` is
  ``kh * kw * cin / groups`` for a convolution (``kh * kw`` for a depthwise
  one) and the input width for a dense layer.
* ``"he_lecun"``: the zoo's own draws: He-normal convolutions, LeCun-normal
  dense layers (Flax's default), zero biases.
* ``"he_fan_out"``: convolution kernels normal with std ``sqrt(2 / fan_out)``,
  ``fan_out = kh * kw * cout`` (PyTorch's ``kaiming_normal_(mode="fan_out",
  nonlinearity="relu")``, which the MultiSFL authors' ResNet-18 applies to
  every convolution); everything else, convolution biases included, drawn
  as ``"torch"`` draws it.

See [docs/models.md](../../docs/models.md#initialisation).
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from jsfl.models import layers

INITS = ("torch", "he_lecun", "he_fan_out")


def _uniform(key, var, bound):
  var[...] = jax.random.uniform(key, var[...].shape, var[...].dtype, -bound, bound)


def _normal(key, var, std):
  var[...] = std * jax.random.normal(key, var[...].shape, var[...].dtype)


def torch_init(module: nnx.Module, key: jax.Array, conv_fan_out: bool = False) -> None:
  """Redraws, in place, every weight and bias of ``module`` as PyTorch's
  default initialisation does; ``conv_fan_out``: convolution kernels He-normal
  over their fan-out instead (``"he_fan_out"``), each from the key its
  uniform draw would have used, so every other parameter is ``"torch"``'s.

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
        if conv_fan_out and var is kernel and not isinstance(node, nnx.Linear):
          # PyTorch's fan-out is cout * kh * kw, whatever the groups
          kh, kw, _, cout = kernel[...].shape
          _normal(jax.random.fold_in(key, k), var, math.sqrt(2.0 / (kh * kw * cout)))
        else:
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
  if scheme not in INITS:
    raise ValueError(f"init={scheme!r}; allowed: {', '.join(INITS)}")
  for i, stage in enumerate(stages):
    torch_init(stage, jax.random.fold_in(key, i), conv_fan_out=scheme == "he_fan_out")
