"""Whole-test-set evaluation in one jitted pass (docs/setting.md#metrics)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jsfl.data import normalize

EVAL_BATCH_CPU = 250
EVAL_BATCH_ACCELERATOR = 1000


def default_eval_batch(backend: str | None = None) -> int:
  """The chunk ``exec.eval_batch = 0`` resolves to.  On XLA:CPU 250-sample
  chunks evaluate the small CNN 2x faster than 1000 (they stay in cache;
  ``benchmarks/eval_lowering.py``; on MobileNetV1 x0.5 the committed passes
  do not tell 250 from 1000 apart); accelerators keep larger chunks, which
  fill them (not measured)."""
  backend = backend or jax.default_backend()
  return EVAL_BATCH_CPU if backend == "cpu" else EVAL_BATCH_ACCELERATOR


def eval_chunk(setting: int) -> int:
  """``exec.eval_batch`` resolved: ``0`` is :func:`default_eval_batch`."""
  return setting or default_eval_batch()


def chunk_test_set(x, y, chunk: int):
  """Pads the test set to whole chunks: ``(C, chunk, ...)`` arrays and a mask
  (``chunk = 0``: :func:`default_eval_batch`)."""
  chunk = eval_chunk(chunk)
  m = x.shape[0]
  chunk = min(chunk, m)
  c = -(-m // chunk)
  pad = c * chunk - m
  xp = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
  yp = np.concatenate([y, np.zeros((pad,), y.dtype)])
  valid = np.arange(c * chunk) < m
  return {"x": xp.reshape((c, chunk) + x.shape[1:]),
          "y": yp.reshape(c, chunk), "valid": valid.reshape(c, chunk)}


def evaluate(model, params, stats, test, mean, std, num_classes: int):
  """Accuracy, loss and per-label accuracy of a model on the chunked test set.

  Args:
    model: the StagedModel.
    params, stats: the whole model (eval mode: running BN statistics).
    test: output of :func:`chunk_test_set` (device arrays).
    mean, std: input normalisation.
    num_classes: L.

  Returns:
    dict of ``accuracy`` (%), ``loss``, ``per_label_accuracy`` (``(L,)`` %,
    0 for labels absent from the test set) and ``present`` (``(L,)`` bool).
  """
  return evaluate_logits(lambda x: model.logits(params, stats, x), test, mean,
                         std, num_classes)


def evaluate_logits(logits_fn, test, mean, std, num_classes: int):
  """:func:`evaluate` for any predictor ``logits_fn(normalised x) -> logits``.

  Methods whose output is not one staged model (SplitFedV3's max-logit over
  client portions, MultiHead's max-logit over heads) evaluate through this.
  """
  def one(chunk):
    x, y, v = chunk
    logits = logits_fn(normalize(x, mean, std))
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    hit = (jnp.argmax(logits, -1) == y) & v
    onehot = jax.nn.one_hot(y, num_classes) * v[:, None]
    return (jnp.sum(ce * v), onehot.T @ hit.astype(jnp.float32),
            jnp.sum(onehot, 0))

  ce, hits, counts = lax.map(one, (test["x"], test["y"], test["valid"]))
  hits, counts = hits.sum(0), counts.sum(0)
  total = jnp.sum(counts)
  present = counts > 0
  return {"accuracy": 100.0 * jnp.sum(hits) / total,
          "loss": jnp.sum(ce) / total,
          "per_label_accuracy": jnp.where(present, 100.0 * hits / jnp.maximum(counts, 1), 0.0),
          "present": present}


def confusion(model, params, stats, test, mean, std, num_classes: int):
  """The ``(L, L)`` int32 confusion matrix of a model on the chunked test
  set: row = true label, column = predicted label (argmax of the logits, as
  :func:`evaluate`'s accuracy counts a hit)."""
  def one(chunk):
    x, y, v = chunk
    pred = jnp.argmax(model.logits(params, stats, normalize(x, mean, std)), -1)
    true = jax.nn.one_hot(y, num_classes, dtype=jnp.int32) * v[:, None].astype(jnp.int32)
    return true.T @ jax.nn.one_hot(pred, num_classes, dtype=jnp.int32)

  return lax.map(one, (test["x"], test["y"], test["valid"])).sum(0)
