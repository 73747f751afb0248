"""The worked example of docs/extending.md (``sfl_smooth``) against the
shared split loop reference, and the claims the document makes about it."""

import ast
import functools
import pathlib

import chex
import jax
import numpy as np
import optax
from conftest import make_fed_data
from loop_reference import (
  TOL,
  make_setup,
  ref_sfl,
  run_rounds,
  tiny_model,
)

from jsfl import config
from jsfl.methods import sfl, sfl_smooth
from jsfl.methods.sfl_smooth import SmoothOptions

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def ref_smooth_grad(model, p, s, act, y, m, cut, eps):
  """The smoothed loss written out: ``-sum(target * log_softmax)``."""
  def f(p_, a_):
    logits, ns = model.apply(p_, s, a_, start=cut, train=True, mask=m)
    L = logits.shape[-1]
    target = (1 - eps) * jax.nn.one_hot(y, L) + eps / L
    ce = -(target * jax.nn.log_softmax(logits)).sum(-1)
    return (ce * m).sum() / jax.numpy.maximum(m.sum(), 1), ns
  (loss, ns), (gp, ga) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(p, act)
  return loss, ns, gp, ga


def test_sfl_smooth_equals_loop():
  eps = 0.2
  setup = make_setup(tiny_model(), DATA, order="cyclic", clients_per_round=3,
                     options=SmoothOptions(smoothing=eps))
  key = jax.random.key(21)
  state, losses = run_rounds(sfl_smooth, setup, DATA, key, 2)
  grad = lambda p, s, a, y, m: ref_smooth_grad(setup.model, p, s, a, y, m, setup.cut, eps)
  (p1, s1, p2, s2), ref_losses, _ = ref_sfl(setup, DATA, key, 2, grad)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  # guard: smoothing changed the training
  plain, _ = run_rounds(sfl, setup, DATA, key, 2)
  diff = max(float(abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(plain.part2), jax.tree.leaves(state.part2)))
  assert diff > 1e-4


def test_zero_smoothing_is_sfl():
  setup = make_setup(tiny_model(), DATA, clients_per_round=3,
                     options=SmoothOptions(smoothing=0.0))
  key = jax.random.key(22)
  a, la = run_rounds(sfl_smooth, setup, DATA, key, 2)
  b, lb = run_rounds(sfl, setup, DATA, key, 2)
  chex.assert_trees_all_close(a.part1 + a.part2, b.part1 + b.part2, **TOL)
  np.testing.assert_allclose(la, lb, **TOL)


def test_smoothed_loss_matches_optax_on_a_hand_case():
  logits = jax.numpy.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
  y = jax.numpy.array([0, 2])
  mask = jax.numpy.array([True, False])
  got = sfl_smooth.smoothed_cross_entropy(0.3, 3)(logits, y, mask)[0]
  want = optax.softmax_cross_entropy(
      logits[:1], optax.smooth_labels(jax.nn.one_hot(y[:1], 3), 0.3))[0]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_example_is_short_and_registered():
  """docs/extending.md promises one file of at most 30 code lines."""
  src = (ROOT / "jsfl/methods/sfl_smooth.py").read_text()
  doc = set()
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, (ast.Module, ast.FunctionDef)) and ast.get_docstring(node):
      d = node.body[0]
      doc |= set(range(d.lineno, d.end_lineno + 1))
  code = [ln for i, ln in enumerate(src.splitlines(), 1)
          if ln.strip() and not ln.strip().startswith("#") and i not in doc]
  assert len(code) <= 30, len(code)
  cfg = config.resolve({"method": {"name": "sfl_smooth", "smoothing": 0.05}})
  assert cfg["method"]["smoothing"] == 0.05
  page = (ROOT / "docs/extending.md").read_text()
  shown = page.split("```python\n", 1)[1].split("```", 1)[0]
  assert shown.strip() == src[src.index("import jax"):].strip(), (
      "docs/extending.md must show jsfl/methods/sfl_smooth.py as it is")
