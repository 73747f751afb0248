"""Layers whose convolution lowering is selectable per backend.

Why this module exists: on XLA:CPU a ``lax.conv`` inside a rolled ``lax.scan``
(a while loop) or under ``vmap`` over stacked client weights (which becomes a
grouped convolution) runs 10-40x slower than the same convolution outside the
loop (measured in ``benchmarks/results/``).  The
same convolution written as im2col + matmul (``conv_impl="im2col"``) is as
fast rolled as unrolled and vmaps at parity with a Python loop, which lets a
whole round stay one jitted program of rolled scans and vmaps on CPU.  On a
GPU the seed axis has the same effect: vmapped over per-seed weights a
convolution is feature-grouped, and cuDNN runs its gradients as forward
convolutions; im2col turns every one into a batched matmul (cuBLAS), so it is
the GPU's default too (:data:`MATMUL_BACKENDS`).  Depthwise 3x3 convolutions likewise have a
``"shifts"`` lowering (nine shifted multiply-adds) next to ``"grouped"``
(``feature_group_count``).

Every layer here is a Flax NNX module taking ``(x, *, train, mask)`` so stages
can pass the batch mask to BatchNorm (padded samples of a ragged batch must not
enter the batch statistics).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jsfl.models.shapes import InputTooSmall

ConvImpl = Literal["xla", "im2col"]
DepthwiseImpl = Literal["grouped", "shifts"]
Norm = Literal["batch", "group", "none"]

CONV_IMPLS = ("xla", "im2col")
DEPTHWISE_IMPLS = ("grouped", "shifts")
NORMS = ("batch", "group", "none")
# A layer's padding: XLA's SAME (a stride-2 3x3 conv over an even size pads
# (0, 1): the extra zero goes after), VALID, or TORCH, PyTorch's
# ``padding=kernel // 2`` on every side ((1, 1) there).  Both give the same
# output shapes and agree at stride 1; at stride 2 on an even size they
# sample the input one pixel apart, so a model ported from PyTorch needs
# TORCH to compute the same function.
PADDINGS = ("SAME", "VALID", "TORCH")
# A model's padding convention (get_model's ``padding``): torch turns every
# SAME layer into TORCH; same leaves them.
PADDING_MODES = ("torch", "same")


# The backends whose measured-fastest training lowerings are im2col and
# shifts.  XLA:CPU: a lax.conv in a rolled loop or over stacked weights is
# 10-40x slower.  XLA:GPU: under the seed vmap a dense convolution becomes a
# feature-grouped one whose weight and input gradients cuDNN runs as forward
# convolutions (the filter the size of the activation map), and at one seed
# the batch-64 steps are launch-bound; an H200 ran a MobileNetV1 server visit
# 2.2x faster at one seed and 2.3x at 16 in im2col + shifts, a ResNet-18
# visit at 8 seeds 3.7x (benchmarks/results/gpu-h200-20261127/).
MATMUL_BACKENDS = ("cpu", "gpu", "cuda", "rocm")


def default_conv_impl(backend: str | None = None) -> str:
  """The measured-fastest dense-conv lowering for ``backend``: im2col on the
  CPU and GPUs (:data:`MATMUL_BACKENDS`), XLA's convolution elsewhere."""
  backend = backend or jax.default_backend()
  return "im2col" if backend in MATMUL_BACKENDS else "xla"


EVAL_CONV_IMPLS = ("auto", "same") + CONV_IMPLS


def inference_conv_impl(impl: str, kernel_shape, choice: str = "auto",
                        backend: str | None = None) -> str:
  """The lowering of one dense conv in an evaluation forward (no gradient).

  ``choice``: ``"same"`` keeps the training lowering ``impl``; ``"xla"`` or
  ``"im2col"`` forces one; ``"auto"`` is the backend's measured faster
  forward.  On XLA:CPU that is ``xla`` for a spatial kernel over >= 8 input
  channels (1.5-1.8x faster than im2col there on the small CNN's 16 -> 32
  conv, ``benchmarks/results/step_breakdown-*``: its nine shifted copies are
  the cost, and a forward has no slow weight gradient to avoid) and the training
  lowering otherwise (im2col wins on one- or three-channel inputs and strided
  stems); elsewhere the training lowering.  Measured in
  ``benchmarks/eval_lowering.py`` (``benchmarks/README.md``).
  """
  if choice not in EVAL_CONV_IMPLS:
    raise ValueError(f"eval_conv_impl={choice!r}; allowed: {EVAL_CONV_IMPLS}")
  if choice == "same":
    return impl
  if choice != "auto":
    return choice
  kh, kw, cin, _ = kernel_shape
  backend = backend or jax.default_backend()
  if backend == "cpu" and kh * kw > 1 and cin >= 8:
    return "xla"
  return impl


def default_depthwise_impl(backend: str | None = None) -> str:
  """The measured-fastest depthwise lowering for ``backend``: shifts on the
  CPU and GPUs (:data:`MATMUL_BACKENDS`), grouped elsewhere."""
  backend = backend or jax.default_backend()
  return "shifts" if backend in MATMUL_BACKENDS else "grouped"


# How im2col's backward forms the kernel gradient: ``"patches"`` builds the
# patch matrix again and takes one matmul with it; ``"taps"`` takes one
# product per kernel tap over a strided view of the input and never holds
# the patch matrix (kh * kw times the input).
IM2COL_GRADS = ("patches", "taps")


def default_im2col_grad(backend: str | None = None) -> str:
  """The kernel-gradient form of im2col's backward for ``backend``.

  The CPU: ``patches``, faster and with fewer temporaries (a training step
  on one core, batch 64: LeNet-5 5.9k against 3.6k samples/s, its 5x5
  kernels over one and six channels making 25 thin products of the taps;
  the small CNN 5.5k against 4.3k; ``benchmarks/im2col_forms.py``).
  Elsewhere ``taps``, which never holds a patch matrix: with one, a
  ResNet-18 server visit of 8 seeds held 4.7 GB of temporaries on an H200
  (``_conv_im2col``).
  """
  backend = backend or jax.default_backend()
  return "patches" if backend == "cpu" else "taps"


# How im2col lowers a spatial convolution over one input channel (a
# Fashion-MNIST stem): ``"stacked"`` stacks the ``kh * kw`` shifted views
# tap-major (contiguous copies) and contracts the taps in one matmul;
# ``"patches"`` builds the channel-minor patch matrix as for wider inputs, a
# concatenation of one-channel views that is slow on the CPU.
IM2COL_NARROWS = ("stacked", "patches")


def default_im2col_narrow(backend: str | None = None) -> str:
  """The one-channel im2col form for ``backend``: ``stacked`` on the CPU (a
  LeNet-5 training step on one core, batch 64: 8.2k against 5.9k samples/s;
  the small CNN 5.7k against 5.5k; ``benchmarks/im2col_forms.py``),
  ``patches`` elsewhere (no measurement yet)."""
  backend = backend or jax.default_backend()
  return "stacked" if backend == "cpu" else "patches"


def _same_pads(size: int, k: int, s: int) -> tuple[int, int, int]:
  out = -(-size // s)
  total = max((out - 1) * s + k - size, 0)
  return out, total // 2, total - total // 2


def _lax_padding(padding: str, kh: int, kw: int):
  """``padding`` as ``lax.conv_general_dilated`` takes it."""
  if padding == "TORCH":
    return ((kh // 2, kh // 2), (kw // 2, kw // 2))
  if padding not in PADDINGS:
    raise ValueError(f"padding={padding!r}; allowed: {', '.join(PADDINGS)}")
  return padding


def _pads(size: int, k: int, s: int, padding: str) -> tuple[int, int, int]:
  """``(output size, zeros before, zeros after)`` along one axis."""
  if padding == "SAME":
    return _same_pads(size, k, s)
  if padding == "TORCH":
    return (size + 2 * (k // 2) - k) // s + 1, k // 2, k // 2
  if padding == "VALID":
    return (size - k) // s + 1, 0, 0
  raise ValueError(f"padding={padding!r}; allowed: {', '.join(PADDINGS)}")


def _patches(x: jax.Array, kh: int, kw: int, stride: int, padding: str):
  """Shifted strided views of ``x`` (NHWC), one per kernel tap."""
  _, h, w, _ = x.shape
  oh, ph0, ph1 = _pads(h, kh, stride, padding)
  ow, pw0, pw1 = _pads(w, kw, stride, padding)
  if ph0 or ph1 or pw0 or pw1:
    x = jnp.pad(x, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
  taps = []
  for i in range(kh):
    for j in range(kw):
      taps.append(lax.slice(
          x, (0, i, j, 0),
          (x.shape[0], i + (oh - 1) * stride + 1, j + (ow - 1) * stride + 1,
           x.shape[3]), (1, stride, stride, 1)))
  return taps, oh, ow


def conv2d(x, kernel, *, stride: int = 1, padding: str = "SAME",
           impl: str = "xla", im2col_grad: str | None = None,
           im2col_narrow: str | None = None):
  """Dense 2-D convolution, NHWC input, HWIO kernel.

  Args:
    x: ``(B, H, W, Cin)`` input.
    kernel: ``(kh, kw, Cin, Cout)`` weights.
    stride: spatial stride.
    padding: ``"SAME"``, ``"VALID"`` or ``"TORCH"`` (:data:`PADDINGS`).
    impl: ``"xla"`` (``lax.conv_general_dilated``) or ``"im2col"`` (shifted
      slices concatenated along channels, then one matmul).
    im2col_grad: how im2col's backward forms the kernel gradient
      (:data:`IM2COL_GRADS`); None: :func:`default_im2col_grad`.
    im2col_narrow: how im2col lowers a spatial kernel over one input channel
      (:data:`IM2COL_NARROWS`); None: :func:`default_im2col_narrow`.

  Returns:
    ``(B, H', W', Cout)``; both lowerings give the same values to float
    tolerance.
  """
  kh, kw, cin, cout = kernel.shape
  if impl == "xla":
    return _conv_xla(x, kernel, stride, _lax_padding(padding, kh, kw))
  if impl != "im2col":
    raise ValueError(f"conv impl={impl!r}; allowed: {CONV_IMPLS}")
  if kh == kw == 1 and padding in PADDINGS:  # no 1x1 convention pads
    xs = x[:, ::stride, ::stride, :]
    return jnp.einsum("bhwc,co->bhwo", xs, kernel[0, 0])
  im2col_grad = im2col_grad or default_im2col_grad()
  if im2col_grad not in IM2COL_GRADS:
    raise ValueError(f"im2col_grad={im2col_grad!r}; allowed: {IM2COL_GRADS}")
  im2col_narrow = im2col_narrow or default_im2col_narrow()
  if im2col_narrow not in IM2COL_NARROWS:
    raise ValueError(f"im2col_narrow={im2col_narrow!r}; allowed: {IM2COL_NARROWS}")
  if cin == 1 and im2col_narrow == "stacked":
    return _conv_narrow(x, kernel, stride, padding)
  return _conv_im2col(x, kernel, stride, padding, im2col_grad)


def _lax_conv(x, kernel, stride, padding):
  return lax.conv_general_dilated(x, kernel, (stride, stride), padding,
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_xla(x, kernel, stride, padding):
  """XLA's convolution with a VJP that stays on backward kernels under vmap.

  A gradient taken inside a vmap over per-seed weights (the engine's server
  step under the seed axis) makes each weight gradient a feature-grouped
  convolution whose filter is the activation map, which cuDNN runs as a
  forward convolution (ResNet-18's server visit of 8 seeds on an H200:
  11.3k samples/s).  Here the backward under vmap is the gradient of the
  vmapped forward instead, whose weight gradient is batch-grouped: cuDNN's
  backward-filter kernel (38.9k samples/s).  The values are autodiff's."""
  return _lax_conv(x, kernel, stride, padding)


def _conv_xla_fwd(x, kernel, stride, padding):
  return _lax_conv(x, kernel, stride, padding), (x, kernel)


def _conv_xla_bwd(stride, padding, res, ct):
  return _conv_xla_grads(stride, padding)(*res, ct)


_conv_xla.defvjp(_conv_xla_fwd, _conv_xla_bwd)


@functools.cache
def _conv_xla_grads(stride, padding):
  """``(x, kernel, ct) -> (d_x, d_kernel)`` whose vmap rule differentiates
  the vmapped convolution (one rule per stride and padding)."""
  conv = functools.partial(_lax_conv, stride=stride, padding=padding)

  @jax.custom_batching.custom_vmap
  def grads(x, kernel, ct):
    return jax.vjp(conv, x, kernel)[1](ct)

  @grads.def_vmap
  def _(axis_size, in_batched, x, kernel, ct):
    x, kernel, ct = (a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)
                     for a, b in zip((x, kernel, ct), in_batched, strict=True))
    return jax.vjp(jax.vmap(conv), x, kernel)[1](ct), (True, True)

  return grads


def _cols(x, kh, kw, stride, padding):
  """The patch matrix ``(B * H' * W', kh * kw * Cin)`` and the output size."""
  taps, oh, ow = _patches(x, kh, kw, stride, padding)
  return jnp.concatenate(taps, axis=-1).reshape(-1, kh * kw * x.shape[-1]), oh, ow


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_im2col(x, kernel, stride, padding, grad):
  """A spatial convolution as one matmul of the input's patches.

  Its own VJP keeps only the input for the backward pass: autodiff would
  keep the patch matrix, ``kh * kw`` times the input; the backward builds
  the patches again, once (with im2col, a ResNet-18 server visit of 8 seeds
  on an H200 held 4.7 GB of temporaries against 4.5 GB for XLA's
  convolution,
  benchmarks/results/gpu-h200-20261127/seed_kernels-gpu-vm-20261127-073847.json;
  ``im2col_grad = "taps"`` never forms them in the backward)."""
  kh, kw, cin, cout = kernel.shape
  cols, oh, ow = _cols(x, kh, kw, stride, padding)
  out = cols @ kernel.reshape(kh * kw * cin, cout)
  return out.reshape(x.shape[0], oh, ow, cout)


def _conv_im2col_fwd(x, kernel, stride, padding, grad):
  return _conv_im2col(x, kernel, stride, padding, grad), (x, kernel)


def _conv_im2col_bwd(stride, padding, grad, res, ct):
  """The kernel gradient from the patch matrix built again (``"patches"``)
  or tap by tap, each a product over one strided view of the input
  (``"taps"``), so that the backward never holds the patch matrix: with it
  and its transpose a ResNet-18 round's part-1 held four 9x copies of its
  32x32x64 activations at once."""
  x, kernel = res
  kh, kw, cin, cout = kernel.shape
  # Ties the views below to the cotangent: without it XLA merges them with
  # the forward's own and keeps those alive from the forward to here.
  if grad == "taps":
    x, ct = lax.optimization_barrier((x, ct))
  ct2 = ct.reshape(-1, cout)
  cols, vjp = jax.vjp(lambda xx: _cols(xx, kh, kw, stride, padding)[0], x)
  if grad == "patches":
    d_kernel = (cols.T @ ct2).reshape(kernel.shape)
  else:  # cols goes unused (XLA drops it)
    taps, _, _ = _patches(x, kh, kw, stride, padding)
    d_kernel = jnp.stack([tap.reshape(-1, cin).T @ ct2
                          for tap in taps]).reshape(kernel.shape)
  (d_x,) = vjp(ct2 @ kernel.reshape(kh * kw * cin, cout).T)
  return d_x, d_kernel


_conv_im2col.defvjp(_conv_im2col_fwd, _conv_im2col_bwd)


def _tap_rows(x, kh, kw, stride, padding):
  """The one-channel input's taps stacked tap-major, ``(kh * kw, B * H' * W')``,
  and the output size."""
  taps, oh, ow = _patches(x, kh, kw, stride, padding)
  return jnp.stack(taps).reshape(kh * kw, -1), oh, ow


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_narrow(x, kernel, stride, padding):
  """A spatial convolution over one input channel as one matmul over its
  taps stacked tap-major (each tap one contiguous copy), with a VJP that
  keeps the input and builds them again for the kernel gradient."""
  kh, kw, _, cout = kernel.shape
  rows, oh, ow = _tap_rows(x, kh, kw, stride, padding)
  return (rows.T @ kernel.reshape(kh * kw, cout)).reshape(x.shape[0], oh, ow, cout)


def _conv_narrow_fwd(x, kernel, stride, padding):
  return _conv_narrow(x, kernel, stride, padding), (x, kernel)


def _conv_narrow_bwd(stride, padding, res, ct):
  x, kernel = res
  kh, kw, _, cout = kernel.shape
  ct2 = ct.reshape(-1, cout)
  rows, vjp = jax.vjp(lambda xx: _tap_rows(xx, kh, kw, stride, padding)[0], x)
  d_kernel = (rows @ ct2).reshape(kernel.shape)
  (d_x,) = vjp(kernel.reshape(kh * kw, cout) @ ct2.T)
  return d_x, d_kernel


_conv_narrow.defvjp(_conv_narrow_fwd, _conv_narrow_bwd)


def depthwise_conv2d(x, kernel, *, stride: int = 1, padding: str = "SAME",
                     impl: str = "grouped"):
  """Depthwise convolution, kernel ``(kh, kw, 1, C)``.

  ``impl="shifts"`` sums ``kh*kw`` shifted, strided views scaled per channel;
  ``"grouped"`` uses ``feature_group_count=C``.
  """
  kh, kw, _, c = kernel.shape
  if impl == "grouped":
    return lax.conv_general_dilated(
        x, kernel, (stride, stride), _lax_padding(padding, kh, kw),
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c)
  if impl != "shifts":
    raise ValueError(f"depthwise impl={impl!r}; allowed: {DEPTHWISE_IMPLS}")
  _pads(x.shape[1], kh, stride, padding)  # a bad name fails here, not in a trace
  return _depthwise_shifts(x, kernel, stride, padding)


def _shifted_sum(taps, kernel, flip: bool = False):
  kh, kw = kernel.shape[:2]
  out = None
  for t, tap in enumerate(taps):
    i, j = divmod(t, kw)
    w = kernel[kh - 1 - i, kw - 1 - j, 0] if flip else kernel[i, j, 0]
    out = tap * w if out is None else out + tap * w
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _depthwise_shifts(x, kernel, stride, padding):
  kh, kw = kernel.shape[:2]
  return _shifted_sum(_patches(x, kh, kw, stride, padding)[0], kernel)


def _depthwise_shifts_fwd(x, kernel, stride, padding):
  return _depthwise_shifts(x, kernel, stride, padding), (x, kernel)


def _depthwise_shifts_bwd(stride, padding, res, ct):
  """The input gradient as one more shifted sum, of the (stride-dilated)
  cotangent against the flipped kernel.  Autodiff of the forward instead
  transposes each of its nine strided slices into a padded copy of the
  whole input and adds them: on XLA:CPU the MobileNetV1 x0.5 step took
  295 ms with those copies and 276 ms with this (one core)."""
  x, kernel = res
  kh, kw = kernel.shape[:2]
  _, h, w, _ = x.shape
  taps, oh, ow = _patches(x, kh, kw, stride, padding)
  # Each tap's kernel gradient is a sum over every (sample, row, column):
  # written as a vector-matrix product XLA:CPU streams it through its matmul
  # kernel, where a reduction over the three leading axes first materialises
  # each padded tap and then reduces it column-wise (MobileNetV1 x0.5 step,
  # one core: 193 -> 153 ms; two cores: 118 -> 97 ms).
  ones = jnp.ones((x.shape[0] * oh * ow,), ct.dtype)
  # HIGHEST keeps the sum in float32 where a backend would round matmul inputs
  d_kernel = jnp.stack([jnp.dot(ones, (tap * ct).reshape(-1, ct.shape[-1]),
                                precision=lax.Precision.HIGHEST,
                                preferred_element_type=_accumulation_type(ct.dtype))
                        for tap in taps])
  d_kernel = d_kernel.reshape(kernel.shape).astype(kernel.dtype)
  _, ph0, ph1 = _pads(h, kh, stride, padding)
  _, pw0, pw1 = _pads(w, kw, stride, padding)
  hp, wp = h + ph0 + ph1, w + pw0 + pw1
  # ct on the padded input's grid (stride - 1 zeros between its rows and
  # columns), framed by kh - 1 / kw - 1 zeros so that every tap's window fits
  grid = lax.pad(ct, jnp.zeros((), ct.dtype), (
      (0, 0, 0), (kh - 1, hp - (oh - 1) * stride - 1, stride - 1),
      (kw - 1, wp - (ow - 1) * stride - 1, stride - 1), (0, 0, 0)))
  windows = [lax.slice(grid, (0, i + ph0, j + pw0, 0),
                       (grid.shape[0], i + ph0 + h, j + pw0 + w, grid.shape[3]))
             for i in range(kh) for j in range(kw)]
  return _shifted_sum(windows, kernel, flip=True), d_kernel


_depthwise_shifts.defvjp(_depthwise_shifts_fwd, _depthwise_shifts_bwd)


def _he_normal(key, shape, dtype=jnp.float32):
  fan_in = math.prod(shape[:-1])
  return jax.random.normal(key, shape, dtype) * math.sqrt(2.0 / fan_in)


class Conv(nnx.Module):
  """Dense conv with selectable lowering (see :func:`conv2d`)."""

  def __init__(self, cin: int, cout: int, kernel: int = 3, *, stride: int = 1,
               padding: str = "SAME", use_bias: bool = True,
               impl: str = "xla", rngs: nnx.Rngs):
    if impl not in CONV_IMPLS:
      raise ValueError(f"conv impl={impl!r}; allowed: {CONV_IMPLS}")
    self.kernel = nnx.Param(_he_normal(rngs.params(), (kernel, kernel, cin, cout)))
    self.bias = nnx.Param(jnp.zeros((cout,))) if use_bias else None
    self.stride, self.padding, self.impl = stride, padding, impl
    # None: the backend's, when traced
    self.im2col_grad: str | None = None
    self.im2col_narrow: str | None = None

  def use_im2col(self, grad: str | None = None, narrow: str | None = None) -> None:
    """Sets the forms of an im2col lowering (:data:`IM2COL_GRADS`,
    :data:`IM2COL_NARROWS`; None keeps one), on an abstract layer as
    :meth:`use_torch_padding`."""
    self.im2col_grad = grad or self.im2col_grad
    self.im2col_narrow = narrow or self.im2col_narrow

  def use_torch_padding(self) -> None:
    """SAME -> TORCH (:data:`PADDINGS`), on an abstract layer before its
    graph definition is split off."""
    if self.padding == "SAME":
      self.padding = "TORCH"

  def for_inference(self, choice: str) -> None:
    """Switches this (abstract) layer to its evaluation lowering
    (:func:`inference_conv_impl`); the parameters are unchanged."""
    self.impl = inference_conv_impl(self.impl, self.kernel.shape, choice)

  def __call__(self, x, *, train: bool = False, mask=None):
    y = conv2d(x, self.kernel[...], stride=self.stride, padding=self.padding,
               impl=self.impl, im2col_grad=self.im2col_grad,
               im2col_narrow=self.im2col_narrow)
    return y if self.bias is None else y + self.bias[...]


class DepthwiseConv(nnx.Module):
  """Depthwise conv with selectable lowering (see :func:`depthwise_conv2d`)."""

  def __init__(self, channels: int, kernel: int = 3, *, stride: int = 1,
               impl: str = "grouped", rngs: nnx.Rngs):
    if impl not in DEPTHWISE_IMPLS:
      raise ValueError(f"depthwise impl={impl!r}; allowed: {DEPTHWISE_IMPLS}")
    self.kernel = nnx.Param(_he_normal(rngs.params(), (kernel, kernel, 1, channels)))
    self.stride, self.impl, self.padding = stride, impl, "SAME"

  def use_torch_padding(self) -> None:
    """SAME -> TORCH, as :meth:`Conv.use_torch_padding`."""
    self.padding = "TORCH"

  def __call__(self, x, *, train: bool = False, mask=None):
    return depthwise_conv2d(x, self.kernel[...], stride=self.stride,
                            padding=self.padding, impl=self.impl)


class BatchNorm(nnx.Module):
  """PyTorch's ``BatchNorm2d`` over NHWC with a sample mask.

  Training normalises by the batch statistics over the valid samples (the
  biased variance) and moves the running ones 0.1 of the way to them, the
  variance unbiased (``n / (n - 1)``, ``n`` the valid values per channel) as
  PyTorch does; evaluation normalises by the running ones.  The state names
  are Flax's (``scale``, ``bias``; ``mean``, ``var``).
  """

  def __init__(self, channels: int, *, momentum: float = 0.1, epsilon: float = 1e-5):
    self.scale = nnx.Param(jnp.ones((channels,)))
    self.bias = nnx.Param(jnp.zeros((channels,)))
    self.mean = nnx.BatchStat(jnp.zeros((channels,)))
    self.var = nnx.BatchStat(jnp.ones((channels,)))
    self.momentum, self.epsilon = momentum, epsilon

  def __call__(self, x, *, use_running_average: bool, mask=None):
    if use_running_average:
      y = (x - self.mean[...]) * lax.rsqrt(self.var[...] + self.epsilon)
      return y * self.scale[...] + self.bias[...]
    c = x.shape[-1]
    x2 = x.reshape(-1, c)
    # the weights, counts and statistics are at least float32 whatever the
    # compute type: a bfloat16 count is exact only up to 256
    acc = _accumulation_type(x.dtype)
    if mask is None:
      w = jnp.ones((x2.shape[0],), acc)
    else:  # one weight per (sample, position): the sample's mask
      w = jnp.broadcast_to(mask, x.shape[:-1] + (1,)).reshape(-1).astype(acc)
    y, mean, var = _batch_norm_train(x2, w, self.scale[...], self.bias[...],
                                     self.epsilon)
    n = jnp.sum(w)
    unbiased = var * (n / jnp.maximum(n - 1, 1))
    m = self.momentum
    self.mean[...] = (1 - m) * self.mean[...] + m * mean
    self.var[...] = (1 - m) * self.var[...] + m * unbiased
    return y.reshape(x.shape)


def _accumulation_type(dtype):
  """float32 for bfloat16 or float32 values, float64 for float64 ones."""
  return jnp.promote_types(dtype, jnp.float32)


def _column_sum(x2, w):
  """``sum_p w[p] * x2[p, :]``.  A reduction, not ``w @ x2``: XLA:CPU was
  seen computing that matmul wrongly inside a round program (right when
  compiled alone; benchmarks/README.md)."""
  return jnp.sum(x2 * w[:, None], axis=0)


def _bn_forward(x2, w, scale, bias, epsilon):
  """Statistics and normalisation in at least float32; ``y`` in ``x2``'s type.  The
  residuals keep ``x2`` in its own type (half the bytes in bfloat16)."""
  low, param = x2, scale
  acc = _accumulation_type(x2.dtype)
  x2, scale, bias = (a.astype(acc) for a in (x2, scale, bias))
  n = jnp.sum(w)
  mean = _column_sum(x2, w) / n
  # One pass over x for both moments (Flax's default too); the clamp keeps a
  # cancelled difference from going negative.
  raw = _column_sum(x2 * x2, w) / n - mean * mean
  var = jnp.maximum(raw, 0.0)
  inv = lax.rsqrt(var + epsilon)
  xhat = (x2 - mean) * inv
  # d var / d raw as autodiff takes it through the clamp (a tie halves)
  d_clamp = jnp.where(raw > 0, 1.0, jnp.where(raw == 0, 0.5, 0.0)).astype(x2.dtype)
  return ((xhat * scale + bias).astype(low.dtype), mean, var), (low, w, mean, inv, param, n,
                                                                 d_clamp)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _batch_norm_train(x2, w, scale, bias, epsilon):
  """Training BatchNorm over rows ``x2`` ``(positions, C)`` weighted 0 / 1 by
  ``w`` (padded samples 0): ``(y, batch mean, biased batch variance)``.

  Its own VJP, autodiff's chain written out step for step: XLA:CPU runs it
  with fewer passes over the activations than the autodiff of the masked
  means (MobileNetV1 x0.5 step on a Zen 5 core: 153 -> 131 ms; two cores
  97 -> 81 ms).  The masked rows enter the statistics with weight 0 and get
  only the direct gradient, as under autodiff."""
  return _bn_forward(x2, w, scale, bias, epsilon)[0]


def _batch_norm_train_fwd(x2, w, scale, bias, epsilon):
  return _bn_forward(x2, w, scale, bias, epsilon)


def _batch_norm_train_bwd(epsilon, res, cts):
  """Autodiff's chain through the forward, written out (a shortened closed
  form rounds differently, which a near-constant channel amplifies)."""
  low, w, mean, inv, param, n, d_clamp = res
  acc = _accumulation_type(low.dtype)
  x2, scale = low.astype(acc), param.astype(acc)
  g, g_mean, g_var = cts
  g = g.astype(acc)
  centred = x2 - mean
  d_bias = jnp.sum(g, axis=0)
  d_scale = jnp.sum(g * centred, axis=0) * inv
  g_xhat = g * scale
  g_inv = jnp.sum(g_xhat * centred, axis=0)
  g_raw = d_clamp * (g_var - 0.5 * inv * inv * inv * g_inv)
  g_sum1 = (g_mean - jnp.sum(g_xhat, axis=0) * inv - 2.0 * mean * g_raw) / n
  g_sum2 = g_raw / n
  wc = w[:, None]
  d_x2 = g_xhat * inv + wc * g_sum1 + 2.0 * x2 * wc * g_sum2
  # scale and bias are parameters of one stage, cast together
  return (d_x2.astype(low.dtype), jnp.zeros_like(w), d_scale.astype(param.dtype),
          d_bias.astype(param.dtype))


_batch_norm_train.defvjp(_batch_norm_train_fwd, _batch_norm_train_bwd)


class Norm2d(nnx.Module):
  """BatchNorm (masked batch statistics, PyTorch's update), GroupNorm, or
  identity."""

  def __init__(self, channels: int, kind: str = "batch", *, groups: int = 8,
               rngs: nnx.Rngs):
    if kind not in NORMS:
      raise ValueError(f"norm={kind!r}; allowed: {NORMS}")
    self.kind = kind
    self.norm: Any  # BatchNorm, GroupNorm or None, by kind
    if kind == "batch":
      self.norm = BatchNorm(channels)
    elif kind == "group":
      self.norm = nnx.GroupNorm(channels, num_groups=math.gcd(groups, channels),
                                rngs=rngs)
    else:
      self.norm = None

  def __call__(self, x, *, train: bool = False, mask=None):
    if self.kind == "batch":
      bn_mask = None
      if mask is not None and train:
        # An all-padding batch would give 0/0 statistics; its update is
        # discarded by the caller, so any finite statistics do.
        mask = jnp.logical_or(mask, ~jnp.any(mask))
        bn_mask = mask.reshape((-1,) + (1,) * (x.ndim - 1))
      return self.norm(x, use_running_average=not train, mask=bn_mask)
    if self.kind == "group":
      return self.norm(x)
    return x


class Dense(nnx.Module):
  """Linear layer (flattens its input first)."""

  def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs):
    if din < 1:  # else a ZeroDivisionError deep in the initialiser
      raise InputTooSmall(f"its dense layer gets {din} input features")
    self.linear = nnx.Linear(din, dout, rngs=rngs)

  def __call__(self, x, *, train: bool = False, mask=None):
    return self.linear(x.reshape(x.shape[0], -1))


ACTIVATIONS = {"relu": jax.nn.relu, "relu6": jax.nn.relu6}


class ConvNormAct(nnx.Module):
  """conv - norm - activation: the stems and pointwise convolutions of the
  CNNs (parameters ``conv``, ``norm``, as the PyTorch ports map them)."""

  def __init__(self, cin, cout, kernel, *, stride=1, padding="SAME", act="relu",
               norm, conv_impl, rngs):
    # A bias in front of a normalisation would be cancelled by its mean.
    self.conv = Conv(cin, cout, kernel, stride=stride, padding=padding,
                     impl=conv_impl, use_bias=norm == "none", rngs=rngs)
    self.norm = Norm2d(cout, norm, rngs=rngs)
    self.act = act

  def __call__(self, x, *, train=False, mask=None):
    return ACTIVATIONS[self.act](self.norm(self.conv(x), train=train, mask=mask))


class Residual(nnx.Module):
  """A ResNet block's shortcut: the identity, or where the block changes the
  shape (stride or width) a 1x1 projection - norm (parameters ``proj``,
  ``proj_norm``).  A block calls :meth:`init_shortcut` in its ``__init__``
  and adds :meth:`shortcut` of its input before the last relu."""

  def init_shortcut(self, cin, cout, stride, *, norm, conv_impl, rngs):
    if stride != 1 or cin != cout:
      # A bias in front of a normalisation would be cancelled by its mean.
      self.proj = Conv(cin, cout, 1, stride=stride, impl=conv_impl,
                       use_bias=norm == "none", rngs=rngs)
      self.proj_norm = Norm2d(cout, norm, rngs=rngs)
    else:
      self.proj = self.proj_norm = None

  def shortcut(self, x, *, train=False, mask=None):
    if self.proj is None:
      return x
    return self.proj_norm(self.proj(x), train=train, mask=mask)


class NormRelu(nnx.Module):
  """norm - relu (a stem's normalisation, or DenseNet's after its last
  block, as a stage of its own)."""

  def __init__(self, channels, *, norm, rngs):
    self.norm = Norm2d(channels, norm, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return jax.nn.relu(self.norm(x, train=train, mask=mask))


class GlobalAvgPool(nnx.Module):
  """Mean over the spatial axes; no parameters."""

  def __call__(self, x, *, train=False, mask=None):
    return avg_pool_global(x)


def max_pool(x, window: int = 2, stride: int | None = None):
  """Max pool NHWC, VALID padding (reshape form when window == stride)."""
  stride = stride or window
  b, h, w, c = x.shape
  if window == stride and h % window == 0 and w % window == 0:
    return x.reshape(b, h // window, window, w // window, window, c).max((2, 4))
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, window, window, 1),
                           (1, stride, stride, 1), "VALID")


def avg_pool_global(x):
  return jnp.mean(x, axis=(1, 2))


# Blocks shared by the small models.
class ConvPoolBlock(nnx.Module):
  """conv - norm - relu - maxpool2."""

  def __init__(self, cin, cout, kernel, *, padding="SAME", norm, conv_impl, rngs):
    # A bias in front of a normalisation would be cancelled by its mean.
    self.conv = Conv(cin, cout, kernel, padding=padding, impl=conv_impl,
                     use_bias=norm == "none", rngs=rngs)
    self.norm = Norm2d(cout, norm, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    x = self.norm(self.conv(x), train=train, mask=mask)
    return max_pool(jax.nn.relu(x), 2)


class DenseRelu(nnx.Module):
  """dense - relu (flattens its input first)."""

  def __init__(self, din, dout, *, rngs):
    self.dense = Dense(din, dout, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return jax.nn.relu(self.dense(x))


def check_options(name: str, input_shape, num_classes: int, norm: str,
                  conv_impl: str, depthwise_impl: str) -> None:
  """Validates the options every model factory shares.

  Args:
    name: model name, for the message.
    input_shape: ``(H, W, C)`` of one sample.
    num_classes: output width.
    norm: one of ``NORMS``.
    conv_impl: one of ``CONV_IMPLS``.
    depthwise_impl: one of ``DEPTHWISE_IMPLS``.

  Raises:
    ValueError: naming the first bad option and what is allowed.
  """
  if len(tuple(input_shape)) != 3 or min(input_shape) < 1:
    raise ValueError(f"{name}: input_shape={tuple(input_shape)!r}; allowed: "
                     "(H, W, C) with positive sizes")
  if not isinstance(num_classes, numbers.Integral) or num_classes < 1:
    raise ValueError(f"{name}: num_classes={num_classes!r}; allowed: an int >= 1")
  if norm not in NORMS:
    raise ValueError(f"{name}: norm={norm!r}; allowed: {NORMS}")
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"{name}: conv_impl={conv_impl!r}; allowed: "
                     f"{CONV_IMPLS}")
  if depthwise_impl not in DEPTHWISE_IMPLS:
    raise ValueError(f"{name}: depthwise_impl={depthwise_impl!r}; allowed: "
                     f"{DEPTHWISE_IMPLS}")


def resolve_options(name: str, input_shape, num_classes: int, norm: str,
                    conv_impl: str | None, depthwise_impl: str | None,
                    width: float | None = None) -> tuple[str, str]:
  """Fills in the backend's default lowerings and validates every option.

  Args:
    name: model name, for messages.
    input_shape, num_classes, norm: as for :func:`check_options`.
    conv_impl, depthwise_impl: a lowering, or None for the backend default.
    width: the width multiplier of models that have one (must be > 0).

  Returns:
    ``(conv_impl, depthwise_impl)`` resolved.
  """
  conv_impl = conv_impl or default_conv_impl()
  depthwise_impl = depthwise_impl or default_depthwise_impl()
  check_options(name, input_shape, num_classes, norm, conv_impl, depthwise_impl)
  if width is not None and (not isinstance(width, numbers.Real) or not width > 0):
    raise ValueError(f"{name}: width={width!r}; allowed: a number > 0")
  return conv_impl, depthwise_impl
