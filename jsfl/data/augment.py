"""Training-time augmentation on the device (docs/setting.md#augmentation).

Both papers' authors train their CIFAR models on torchvision's
``RandomCrop(size, padding=4)`` and ``RandomHorizontalFlip()``: the raw
image is padded with 4 black pixels a side, a window of the image's size is
cut at a uniformly random offset (0 to 8 on each axis), and the result is
mirrored left-right with probability 1/2.  :func:`crop_flip` does the same to
a gathered batch of uint8 images, before normalisation (so the padding is
black, as theirs), with every draw a function of a key and the sample's
index: one draw per sample and key, whatever the batch's shape or order.
The Hydra authors' CIFAR-100 transform then rotates by an angle uniform in
[-15, 15] degrees (``RandomRotation(15)`` on the PIL image: nearest pixel,
corners filled black): :func:`rotate`.  Their Tiny-ImageNet transform flips
too, after a ``RandomResizedCrop(224)`` jsfl does not make (it trains on the
64 x 64 images): :func:`flip` alone.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

AUGMENTS = ("none", "flip", "crop_flip", "crop_flip_rotate")
PAD = 4  # torchvision's RandomCrop(padding=4), as both authors' CIFAR transforms
DEGREES = 15.0  # RandomRotation(15), the Hydra authors' CIFAR-100 transform
# Streams of a sample's key: the crop and flip, the rotation.
_CROP_FLIP, _ROTATE = 0, 1


@struct.dataclass
class Augment:
  """A training round's augmentation: its key and the (static) mode."""

  key: jax.Array
  mode: str = struct.field(pytree_node=False)


def apply(aug: Augment, idx, x):
  """``x`` (the raw images of the samples ``idx``) augmented by ``aug``."""
  if aug.mode == "flip":
    return flip(aug.key, idx, x)
  x = crop_flip(aug.key, idx, x)
  if aug.mode == "crop_flip_rotate":
    x = rotate(aug.key, idx, x)
  return x


def per_sample(key, idx, stream: int, draw):
  """``draw(k)`` for every sample of ``idx`` (any shape), ``k`` the sample's
  key on ``stream``: ``fold_in(fold_in(key, index), stream)``, so a sample's
  draw depends on the key and its index only; each output of ``draw``
  reshaped to ``idx``'s shape."""
  def one(i):
    return draw(jax.random.fold_in(jax.random.fold_in(key, i), stream))
  out = jax.vmap(one)(jnp.reshape(idx, (-1,)))
  return jax.tree.map(lambda a: a.reshape(jnp.shape(idx)), out)


def crop_flip_draws(key, idx):
  """Each sample's ``(row offset, column offset, flip)``: offsets uniform in
  ``[0, 2 PAD]``, flip with probability 1/2, drawn from ``fold_in(key,
  index)``.

  Args:
    key: PRNG key.
    idx: int sample indices of any shape.

  Returns:
    ``(dy, dx, flip)``, each of ``idx``'s shape (int32, int32, bool).
  """
  def draw(k):
    k_crop, k_flip = jax.random.split(k)
    dy, dx = jax.random.randint(k_crop, (2,), 0, 2 * PAD + 1)
    return dy, dx, jax.random.bernoulli(k_flip)
  return per_sample(key, idx, _CROP_FLIP, draw)


def crop_flip(key, idx, x):
  """torchvision's ``RandomCrop(H, padding=4)`` then ``RandomHorizontalFlip()``
  on raw images, one draw per sample (:func:`crop_flip_draws`).

  Args:
    key: PRNG key.
    idx: int sample indices, shape ``S``.
    x: the samples' raw images, shape ``S + (H, W, C)``.

  Returns:
    The augmented images, ``x``'s shape and dtype.
  """
  dy, dx, flip = crop_flip_draws(key, idx)
  H, W, C = x.shape[-3:]
  flat = x.reshape((-1, H, W, C))
  padded = jnp.pad(flat, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))

  def one(img, y0, x0, f):
    win = lax.dynamic_slice(img, (y0, x0, 0), (H, W, C))
    return jnp.where(f, win[:, ::-1], win)
  out = jax.vmap(one)(padded, dy.reshape(-1), dx.reshape(-1), flip.reshape(-1))
  return out.reshape(x.shape)


def flip(key, idx, x):
  """torchvision's ``RandomHorizontalFlip()`` alone, each sample mirrored by
  its :func:`crop_flip_draws` flip (the same draw ``crop_flip`` uses); ``x``
  of shape ``idx.shape + (H, W, C)``."""
  _, _, f = crop_flip_draws(key, idx)
  return jnp.where(f[..., None, None, None], x[..., :, ::-1, :], x)


def rotate_angles(key, idx):
  """Each sample's angle in degrees, uniform in ``[-DEGREES, DEGREES]``, from
  the sample's key (a stream apart from its crop and flip)."""
  return per_sample(key, idx, _ROTATE,
                    lambda k: jax.random.uniform(k, (), jnp.float32, -DEGREES, DEGREES))


def rotate_image(img, degrees):
  """PIL's ``Image.rotate(degrees, NEAREST)`` of one ``(H, W, C)`` image:
  counter-clockwise about ``(W / 2, H / 2)``, each output pixel centre
  mapped back by the inverse rotation and the source pixel it lands in
  taken (black outside).  Float arithmetic where PIL steps in 16.16 fixed
  point, so a pixel whose source lies on a pixel edge can differ."""
  H, W, _ = img.shape
  t = -degrees * (math.pi / 180.0)
  cos, sin = jnp.cos(t), jnp.sin(t)
  cx, cy = W / 2.0, H / 2.0
  ys, xs = jnp.meshgrid(jnp.arange(H, dtype=jnp.float32) + 0.5,
                        jnp.arange(W, dtype=jnp.float32) + 0.5, indexing="ij")
  # PIL's affine matrix (a, b, c, d, e, f): source = (a x + b y + c, d x + e y + f)
  sx = cos * (xs - cx) + sin * (ys - cy) + cx
  sy = -sin * (xs - cx) + cos * (ys - cy) + cy
  ix, iy = jnp.floor(sx).astype(jnp.int32), jnp.floor(sy).astype(jnp.int32)
  inside = (ix >= 0) & (ix < W) & (iy >= 0) & (iy < H)
  out = img[jnp.clip(iy, 0, H - 1), jnp.clip(ix, 0, W - 1)]
  return jnp.where(inside[..., None], out, jnp.zeros_like(out))


def rotate(key, idx, x):
  """``RandomRotation(DEGREES)`` of raw images, one angle per sample
  (:func:`rotate_angles`); ``x`` of shape ``idx.shape + (H, W, C)``."""
  angles = rotate_angles(key, idx).reshape(-1)
  H, W, C = x.shape[-3:]
  out = jax.vmap(rotate_image)(x.reshape((-1, H, W, C)), angles)
  return out.reshape(x.shape)
