"""A synthetic, learnable image classification dataset of any shape.

Each class ``l`` has a smooth random prototype image ``P_l`` (Gaussian noise
on a grid of a quarter of the resolution, bilinearly upsampled, standardised
per image); a bank of 64 more such images, shared by all classes, serves as
background clutter.  A sample of class ``y`` is, in pixel units,

    x = 128 + 40 * (c * roll(P_y, s) + m * roll(P_y', s) + b * roll(B_k, t))
        + e

quantised to uint8, with a per-sample contrast ``c ~ U(0.6, 1.4)``, a shift
``s`` of at most a quarter of the image per axis, a distractor prototype
``P_y'`` of another random class with weight ``m ~ U(0, 0.5)``, a random
background ``B_k`` at a uniformly random shift ``t`` with weight
``b ~ noise * U(0.5, 1.5)``, and pixel noise ``e`` of std ``noise * 20``.

With the default ``noise=1`` and 10 classes a nearest-class-mean classifier
is clearly above chance but far from perfect (about 27% on 28x28x1, 65% on
32x32x3), while a small CNN, being shift-equivariant, does much better (3
conv layers, 5 epochs on 5000 samples: about 70% on 28x28x1, 86% on 32x32x3).
``noise=0`` is much easier, larger ``noise`` harder.

Generation is vectorised and chunked, with integer pixel noise (the sum of two
uniform bytes), so 50k samples of 32x32x3 take a couple of seconds.
"""

from __future__ import annotations

import numbers

import numpy as np

_SCALE = 40.0  # pixel units per prototype standard deviation
_CHUNK = 2048  # samples per chunk: keeps temporaries in cache
_BANK_SIZE = 64  # class-independent smooth background images
# std of u1 + u2 for independent u ~ U{0..255}
_TRI_STD = float(np.sqrt(2 * (256**2 - 1) / 12))
# Beyond this the images are clipped noise anyway, and the fixed-point noise
# arithmetic (int32) would overflow.
MAX_NOISE = 100.0
# Images plus the float64 prototypes and their temporaries; a larger request
# would end in a MemoryError (or the OOM killer) instead of one line.
MAX_BYTES = 2**34


def _interp_matrix(out_size: int, in_size: int) -> np.ndarray:
  """``(out, in)`` bilinear (align-corners) interpolation weights."""
  pos = np.linspace(0.0, in_size - 1.0, out_size)
  lo = np.clip(np.floor(pos).astype(int), 0, in_size - 2)
  frac = pos - lo
  m = np.zeros((out_size, in_size))
  m[np.arange(out_size), lo] = 1.0 - frac
  m[np.arange(out_size), lo + 1] = frac
  return m


def _prototypes(rng: np.random.Generator, num_classes: int,
                shape: tuple[int, int, int]) -> np.ndarray:
  h, w, c = shape
  gh, gw = max(2, -(-h // 4)), max(2, -(-w // 4))
  coarse = rng.standard_normal((num_classes, gh, gw, c))
  protos = np.einsum("hi,lijc,wj->lhwc", _interp_matrix(h, gh), coarse,
                     _interp_matrix(w, gw))
  protos -= protos.mean(axis=(1, 2, 3), keepdims=True)
  protos /= protos.std(axis=(1, 2, 3), keepdims=True) + 1e-12
  return protos.astype(np.float32)


def _rolled(flat: np.ndarray, which: np.ndarray, dy: np.ndarray,
            dx: np.ndarray, h: int, w: int) -> np.ndarray:
  """``roll(images[which[i]], (dy[i], dx[i]))`` for all i, as one flat take.

  ``flat`` is ``images`` reshaped to ``(K * H * W, C)``; a single flat index
  is several times faster than three broadcast fancy indices.
  """
  rows = (np.arange(h)[None] - dy[:, None]) % h
  cols = (np.arange(w)[None] - dx[:, None]) % w
  idx = (which[:, None, None] * h + rows[:, :, None]) * w + cols[:, None, :]
  return np.take(flat, idx, axis=0)


def _samples(rng: np.random.Generator, protos: np.ndarray, bank: np.ndarray,
             n: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
  num_classes, h, w, c = protos.shape
  protos_flat, bank_flat = protos.reshape(-1, c), bank.reshape(-1, c)
  # Balanced labels: partitions such as dominant-label need every class.
  y = rng.permutation(np.arange(n) % num_classes).astype(np.int32)
  other = (y + rng.integers(1, num_classes, n)) % num_classes
  contrast = rng.uniform(0.6, 1.4, n).astype(np.float32)
  mix = rng.uniform(0.0, 0.5, n).astype(np.float32)
  sh, sw = h // 4, w // 4
  dy, dx = rng.integers(-sh, sh + 1, n), rng.integers(-sw, sw + 1, n)
  k = rng.integers(0, len(bank), n)
  by, bx = rng.integers(0, h, n), rng.integers(0, w, n)
  bg = rng.uniform(0.5, 1.5, n).astype(np.float32) * noise
  # Pixel noise: the sum of two uniform bytes, rescaled in fixed point (1/256).
  noise_mul = round(0.5 * noise * _SCALE / _TRI_STD * 256)
  x = np.empty((n, h, w, c), np.uint8)
  for s in range(0, n, _CHUNK):
    e = min(s + _CHUNK, n)
    v = _rolled(protos_flat, y[s:e], dy[s:e], dx[s:e], h, w)
    v *= contrast[s:e, None, None, None]
    v += _rolled(protos_flat, other[s:e], dy[s:e], dx[s:e], h, w) * \
        mix[s:e, None, None, None]
    if noise:
      v += _rolled(bank_flat, k[s:e], by[s:e], bx[s:e], h, w) * \
          bg[s:e, None, None, None]
    v = (v * _SCALE + 128.0).astype(np.int32)
    if noise_mul:
      u = rng.integers(0, 256, v.shape, dtype=np.uint8).astype(np.int32)
      u += rng.integers(0, 256, v.shape, dtype=np.uint8)
      u -= 255
      u *= noise_mul
      u >>= 8
      v += u
    np.clip(v, 0, 255, out=v)
    x[s:e] = v
  return x, y


def _is_int(v) -> bool:
  # bool is an int subclass, but True as a size is a config mistake.
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def make_synthetic(*, input_shape=(32, 32, 3), num_classes: int = 10,
                   train_size: int = 10000, test_size: int = 2000,
                   seed: int = 0, noise: float = 1.0
                   ) -> dict[str, np.ndarray]:
  """Generates the synthetic dataset (see the module docstring).

  The prototypes depend only on ``seed``, ``input_shape`` and
  ``num_classes``; the train and test samples come from independent streams,
  so the test set does not change with ``train_size``.

  Args:
    input_shape: ``(H, W, C)`` of one image.
    num_classes: number of labels (>= 2).
    train_size: number of training samples (>= 1).
    test_size: number of test samples (>= 1).
    seed: the seed of everything.
    noise: pixel noise standard deviation relative to the prototype signal
      (in [0, :data:`MAX_NOISE`]); larger is harder.

  Returns:
    ``{"x_train": uint8 (N, H, W, C), "y_train": int32 (N,), "x_test",
    "y_test"}``.

  Raises:
    ValueError: a bad argument (the message names it and what is allowed),
      or sizes needing more than :data:`MAX_BYTES` of memory.
  """
  shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else ()
  if len(shape) != 3 or not all(_is_int(d) and d >= 1 for d in shape):
    raise ValueError(f"input_shape={input_shape!r}; allowed: (H, W, C) of "
                     "positive ints")
  shape = tuple(int(d) for d in shape)
  for arg, val, low in (("num_classes", num_classes, 2),
                        ("train_size", train_size, 1),
                        ("test_size", test_size, 1)):
    if not _is_int(val) or val < low:
      raise ValueError(f"{arg}={val!r}; allowed: an int >= {low}")
  if not _is_int(seed) or seed < 0:
    raise ValueError(f"seed={seed!r}; allowed: an int >= 0")
  if (not isinstance(noise, numbers.Real) or isinstance(noise, (bool, np.bool_))
      or not 0 <= noise <= MAX_NOISE):
    raise ValueError(f"noise={noise!r}; allowed: a float in [0, {MAX_NOISE:g}]")
  pixels = int(np.prod(shape, dtype=object))
  need = ((int(train_size) + int(test_size)) * pixels
          + 16 * (int(num_classes) + _BANK_SIZE) * pixels)
  if need > MAX_BYTES:
    raise ValueError(
        f"train_size={train_size!r}, test_size={test_size!r}, "
        f"input_shape={input_shape!r}, num_classes={num_classes!r} need "
        f"{need / 2**30:.3g} GiB; allowed: at most {MAX_BYTES / 2**30:g} GiB "
        "(fewer or smaller images, or fewer classes)")
  proto_ss, train_ss, test_ss = np.random.SeedSequence(int(seed)).spawn(3)
  proto_rng = np.random.default_rng(proto_ss)
  protos = _prototypes(proto_rng, int(num_classes), shape)
  bank = _prototypes(proto_rng, _BANK_SIZE, shape)
  x_train, y_train = _samples(np.random.default_rng(train_ss), protos, bank,
                              int(train_size), float(noise))
  x_test, y_test = _samples(np.random.default_rng(test_ss), protos, bank,
                            int(test_size), float(noise))
  return {"x_train": x_train, "y_train": y_train, "x_test": x_test,
          "y_test": y_test}
