"""Seed-batched rounds on matmul kernels and within memory: the lowerings
under the seed vmap equal XLA's convolution, the two client passes of a
sequential server give the same round, and the GPU's default round program
holds no feature-grouped convolution (docs/performance.md)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_script, make_fed_data
from loop_reference import TOL, make_setup, tiny_model

from jsfl.methods import hydra, sfl
from jsfl.methods.hydra import HydraOptions
from jsfl.models import layers

S = 3  # seeds


def _vmapped_case(fn, impls, kernel, cin, cout, stride, padding, seed=0):
  """Values and both gradients of ``fn`` under ``impls``, vmapped over a
  seed axis with per-seed inputs, weights and cotangents; the gradient is
  taken inside the vmap, as the engine's server step takes it."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(S, 2, 9, 10, cin)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(S, kernel, kernel, cin // (cin if fn is
                                   layers.depthwise_conv2d else 1), cout)), jnp.float32)
  shape = jax.eval_shape(functools.partial(fn, stride=stride, padding=padding,
                                           impl=impls[0]), x[0], w[0]).shape
  ct = jnp.asarray(rng.normal(size=(S,) + shape), jnp.float32)
  out = []
  for impl in impls:
    f = functools.partial(fn, stride=stride, padding=padding, impl=impl)

    def one(x1, w1, c1, f=f):
      y, vjp = jax.vjp(f, x1, w1)
      return y, vjp(c1)
    out.append(jax.jit(jax.vmap(one))(x, w, ct))
  return out


@pytest.mark.parametrize("kernel,stride,padding", [
    (1, 1, "SAME"), (1, 2, "TORCH"), (3, 1, "TORCH"), (3, 2, "TORCH"), (3, 2, "SAME"),
    (3, 1, "VALID"), (5, 2, "VALID")])
def test_im2col_under_the_seed_vmap_equals_xla(kernel, stride, padding):
  (y0, g0), (y1, g1) = _vmapped_case(layers.conv2d, ("xla", "im2col"), kernel, 3, 4,
                                     stride, padding)
  assert float(jnp.abs(y0).max()) > 0.1
  chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)
  # the seeds are independent: seed 1's weights change seed 1's output alone
  assert float(jnp.abs(y0[1] - y0[0]).max()) > 0.1


@pytest.mark.parametrize("stride,padding", [(1, "TORCH"), (2, "TORCH"), (2, "SAME")])
def test_depthwise_shifts_under_the_seed_vmap_equals_grouped(stride, padding):
  (y0, g0), (y1, g1) = _vmapped_case(layers.depthwise_conv2d, ("grouped", "shifts"), 3,
                                     5, 5, stride, padding)
  assert float(jnp.abs(y0).max()) > 0.1
  chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)


def test_im2col_keeps_the_input_not_its_patches():
  """The backward of an im2col convolution holds the input, not the patch
  matrix nine times its size (the residuals of ``jax.vjp``)."""
  x = jnp.ones((4, 16, 16, 8))
  w = jnp.ones((3, 3, 8, 8))
  _, vjp = jax.vjp(lambda a, b: layers.conv2d(a, b, impl="im2col"), x, w)
  held = sum(leaf.size for leaf in jax.tree.leaves(vjp))
  assert held <= x.size + w.size + 64, held


def _rounds(method, setup, data, key, rounds=2):
  state = method.init(setup, key)
  step = jax.jit(lambda s, k: method.round(setup, s, data, k))
  for r in range(rounds):
    state, _ = step(state, jax.random.fold_in(key, r))
  return state


@pytest.mark.parametrize("client_exec", ["vmap", "unroll"])
@pytest.mark.parametrize("name", ["sfl", "hydra"])
def test_client_passes_give_the_same_rounds(name, client_exec):
  """Part-1 inside the server's visits (the default) or side by side before
  them: the same two rounds, ragged clients included (padded steps, a client
  without a batch at a step), partial participation."""
  data = make_fed_data([7, 3, 10, 5], dominant=np.arange(4, dtype=np.int32) % 4)
  extra = {"options": HydraOptions(groups=2, superclasses="consecutive")} if name == "hydra" else {}
  method = {"sfl": sfl, "hydra": hydra}[name]
  key = jax.random.key(5)
  states = [_rounds(method, make_setup(tiny_model(), data, client_exec=client_exec,
                                       clients_per_round=3, client_pass=cp,
                                       order="cyclic", **extra), data, key)
            for cp in ("per_visit", "batched")]
  start = method.init(make_setup(tiny_model(), data, **extra), key)
  assert float(jnp.abs(states[0].part1[0]["conv"]["kernel"]
                       - start.part1[0]["conv"]["kernel"]).max()) > 1e-3
  chex.assert_trees_all_close(states[0], states[1], **TOL)


def _census(model, conv, dw, seeds=2):
  census = load_script("benchmarks/census.py")
  from jsfl import config as config_lib
  cfg = config_lib.load_config(None, [
      "dataset.name=synthetic", "dataset.train_size=96", "dataset.test_size=8",
      "dataset.input_shape=[32, 32, 3]", f"model.name={model}", "model.width=0.125",
      "method.name=sfl", "method.batch_size=8", "partition.num_clients=3",
      f"run.seeds={seeds}", "exec.client_exec=vmap", "exec.seed_exec=vmap",
      f"model.conv_impl={conv}", f"model.depthwise_impl={dw}"])
  return census.round_census(cfg, compile_=False)


@pytest.mark.parametrize("model", ["mobilenet_v1", "resnet18"])
def test_gpu_default_round_has_no_feature_grouped_convolution(model):
  """The SFL round with clients and seeds vmapped, lowered as a GPU lowers
  it (the GPU's default lowerings): no dense convolution is feature-grouped
  (every one is a batched matmul), so none of its gradients can fall to
  cuDNN's forward kernels; XLA's lowering of the same round is grouped
  throughout."""
  gpu = _census(model, layers.default_conv_impl("gpu"), layers.default_depthwise_impl("gpu"))
  assert gpu["feature_grouped"] == 0, gpu["convolutions"]
  assert gpu["dot_general"]["batched"] > 10
  old = _census(model, "xla", "grouped")
  assert old["feature_grouped"] >= 20, old["convolutions"]
