"""Training-time augmentation on the device (docs/setting.md#augmentation).

Both papers' authors train their CIFAR models on torchvision's
``RandomCrop(size, padding=4)`` and ``RandomHorizontalFlip()``: the raw
image is padded with 4 black pixels a side, a window of the image's size is
cut at a uniformly random offset (0 to 8 on each axis), and the result is
mirrored left-right with probability 1/2.  :func:`crop_flip` does the same to
a gathered batch of uint8 images, before normalisation (so the padding is
black, as theirs), with every draw a function of a key and the sample's
index: one draw per sample and key, whatever the batch's shape or order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

AUGMENTS = ("none", "crop_flip")
PAD = 4  # torchvision's RandomCrop(padding=4), as both authors' CIFAR transforms


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
  def one(i):
    k_crop, k_flip = jax.random.split(jax.random.fold_in(key, i))
    dy, dx = jax.random.randint(k_crop, (2,), 0, 2 * PAD + 1)
    return dy, dx, jax.random.bernoulli(k_flip)
  flat = jnp.reshape(idx, (-1,))
  dy, dx, flip = jax.vmap(one)(flat)
  shape = jnp.shape(idx)
  return dy.reshape(shape), dx.reshape(shape), flip.reshape(shape)


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
  *lead, H, W, C = x.shape
  flat = x.reshape((-1, H, W, C))
  padded = jnp.pad(flat, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))

  def one(img, y0, x0, f):
    win = lax.dynamic_slice(img, (y0, x0, 0), (H, W, C))
    return jnp.where(f, win[:, ::-1], win)
  out = jax.vmap(one)(padded, dy.reshape(-1), dx.reshape(-1), flip.reshape(-1))
  return out.reshape(x.shape)
