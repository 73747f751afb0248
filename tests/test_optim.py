"""``optim.clip_norm``: PyTorch's ``clip_grad_norm_`` ahead of the optimiser
step, checked against the formula in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DEFAULT_XLA, compiled_rounds

from jsfl import config as config_lib
from jsfl.core.optim import make_optimizer, with_lr


def tree(seed, scale=1.0):
  r = np.random.default_rng(seed)
  return {"w": jnp.asarray(scale * r.normal(size=(3, 4)), jnp.float32),
          "b": jnp.asarray(scale * r.normal(size=(4,)), jnp.float32)}


def np_steps(params, grads, lr, wd, mom, clip):
  """Two SGD steps as PyTorch runs them: ``clip_grad_norm_`` (one norm over
  every leaf, ``max_norm / (norm + 1e-6)`` capped at 1), then ``step()``
  (weight decay added to the clipped gradient, then momentum)."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  buf = {k: np.zeros_like(v) for k, v in p.items()}
  for g in grads:
    g = {k: np.asarray(v, np.float64) for k, v in g.items()}
    norm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    coef = min(1.0, clip / (norm + 1e-6)) if clip else 1.0
    for k in p:
      d = coef * g[k] + wd * p[k]
      buf[k] = mom * buf[k] + d if mom else d
      p[k] = p[k] - lr * buf[k]
  return p


def jsfl_steps(params, grads, lr, wd, mom, clip):
  tx = make_optimizer(mom, wd, "sgd", clip_norm=clip)
  state = with_lr(tx.init(params), lr)
  for g in grads:
    upd, state = tx.update(g, state, params)
    params = jax.tree.map(jnp.add, params, upd)
  return params


@pytest.mark.parametrize("clip", [0.5, 3.0, 100.0])
@pytest.mark.parametrize("mom", [0.0, 0.5])
def test_clipped_sgd_matches_pytorch_formula(clip, mom):
  params = tree(0)
  grads = [tree(1, scale=2.0), tree(2, scale=0.1)]  # norms ~8 and ~0.4
  got = jsfl_steps(params, grads, 0.1, 1e-2, mom, clip)
  want = np_steps(params, grads, 0.1, 1e-2, mom, clip)
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6)


def test_the_bound_changes_large_steps_and_leaves_small_ones_bit_for_bit():
  params = tree(0)
  small = [tree(2, scale=0.1)]
  for how in ("sgd", "adam"):
    free = make_optimizer(0.5, 1e-2, how)
    clipped = make_optimizer(0.5, 1e-2, how, clip_norm=50.0)
    a = free.update(small[0], with_lr(free.init(params), 0.1), params)[0]
    b = clipped.update(small[0], with_lr(clipped.init(params), 0.1), params)[0]
    for k in a:  # under the bound: multiplied by exactly 1
      np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
  big = [tree(1, scale=100.0)]
  a = jsfl_steps(params, big, 0.1, 0.0, 0.0, 0.0)
  b = jsfl_steps(params, big, 0.1, 0.0, 0.0, 1.0)
  step = np.sqrt(sum(np.sum((np.asarray(b[k]) - np.asarray(params[k])) ** 2) for k in b))
  np.testing.assert_allclose(step, 0.1, rtol=1e-5)  # lr * max_norm
  assert not np.allclose(np.asarray(a["w"]), np.asarray(b["w"]))


def test_clip_norm_is_a_checked_config_key():
  cfg = config_lib.resolve({"optim": {"clip_norm": 50.0}})
  assert config_lib.typed(cfg).optim.clip_norm == 50.0
  assert config_lib.typed(config_lib.resolve({})).optim.clip_norm == 0.0
  with pytest.raises(config_lib.ConfigError, match=r"optim.clip_norm=-1.0; allowed: a float >= 0"):
    config_lib.resolve({"optim": {"clip_norm": -1.0}})


def _compiled_rounds(clip: float, rounds: int = 3):
  """The state after ``rounds`` of a compiled FedSeq program (LeNet-5,
  weight decay, two seeds), as ``jsfl run`` builds and XLA compiles it, and
  every round's metrics."""
  cfg = config_lib.load_config(None, [
      "dataset.name=synthetic", "dataset.input_shape=[28, 28, 1]", "dataset.num_classes=10",
      "dataset.train_size=2000", "dataset.test_size=200", "model.name=lenet5",
      "partition.name=exdir", "partition.num_clients=10", "partition.alpha=0.5",
      "partition.classes_per_client=2", "method.name=fedseq", "method.clients_per_round=5",
      "method.local_epochs=2", "method.batch_size=64", "optim.lr=0.01",
      "optim.weight_decay=1e-4", "run.seeds=2", f"run.rounds={rounds}",
      f"optim.clip_norm={clip}"])
  # At XLA's default optimisation, as users' runs compile: the suite's -O1
  # did not fuse the products that differed.
  return compiled_rounds(cfg, rounds, DEFAULT_XLA)


def test_a_bound_no_step_reaches_leaves_the_run_bit_for_bit():
  # Compiled, a product by a computed 1 is fused and reordered with what is
  # around it: with ``g * scale`` under the bound a seed's training loss of
  # round 3 here came out one rounding apart from the unclipped run's,
  # though nothing was clipped.  Records and model alike must match.
  free, bounded = _compiled_rounds(0.0), _compiled_rounds(1e30)
  for a, b in zip(jax.tree.leaves(free), jax.tree.leaves(bounded), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
