"""Seed-batched rounds on matmul kernels and within memory: the lowerings
under the seed vmap equal XLA's convolution, the two client passes of a
sequential server give the same round, and the GPU's default round program
holds no feature-grouped convolution (docs/performance.md)."""

import dataclasses
import functools
import os

import chex
import jax
import jax.flatten_util
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
                                           impl=impls[-1]), x[0], w[0]).shape
  ct = jnp.asarray(rng.normal(size=(S,) + shape), jnp.float32)
  out = []
  for impl in impls:
    if impl == "lax":  # the reference: XLA's convolution under autodiff's own VJP
      def f(a, b):
        kh, kw = b.shape[:2]
        return jax.lax.conv_general_dilated(
            a, b, (stride, stride), layers._lax_padding(padding, kh, kw),
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
    else:
      f = functools.partial(fn, stride=stride, padding=padding, impl=impl)

    def one(x1, w1, c1, f=f):
      y, vjp = jax.vjp(f, x1, w1)
      return y, vjp(c1)
    out.append(jax.jit(jax.vmap(one))(x, w, ct))
  return out


@pytest.mark.parametrize("kernel,stride,padding", [
    (1, 1, "SAME"), (1, 2, "TORCH"), (3, 1, "TORCH"), (3, 2, "TORCH"), (3, 2, "SAME"),
    (3, 1, "VALID"), (5, 2, "VALID")])
@pytest.mark.parametrize("grad", layers.IM2COL_GRADS)
def test_im2col_under_the_seed_vmap_equals_xla(kernel, stride, padding, grad):
  (y0, g0), (y1, g1) = _vmapped_case(functools.partial(layers.conv2d, im2col_grad=grad),
                                     ("xla", "im2col"), kernel, 3, 4, stride, padding)
  assert float(jnp.abs(y0).max()) > 0.1
  chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)
  # the seeds are independent: seed 1's weights change seed 1's output alone
  assert float(jnp.abs(y0[1] - y0[0]).max()) > 0.1


@pytest.mark.parametrize("kernel,stride,padding", [
    (1, 2, "TORCH"), (3, 1, "TORCH"), (3, 2, "TORCH"), (3, 2, "SAME"), (5, 2, "VALID")])
def test_xla_under_the_seed_vmap_equals_autodiff(kernel, stride, padding):
  """``impl="xla"``'s own VJP (the gradient of the vmapped convolution under
  vmap) gives autodiff's values and gradients of lax.conv_general_dilated."""
  (y0, g0), (y1, g1) = _vmapped_case(layers.conv2d, ("lax", "xla"), kernel, 3, 4,
                                     stride, padding)
  assert float(jnp.abs(y0).max()) > 0.1
  chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)


def test_xla_weight_gradients_are_batch_grouped_under_the_seed_vmap():
  """Under vmap of a gradient, autodiff's weight gradient of a convolution
  is feature-grouped with the activation map as its filter (a cuDNN forward
  kernel); ``impl="xla"``'s is batch-grouped (cuDNN's backward-filter)."""
  census = load_script("benchmarks/census.py")
  x, w = jnp.ones((S, 2, 9, 10, 3)), jnp.ones((S, 3, 3, 3, 4))

  def lowered(impl):
    def one(a, b):
      if impl == "lax":
        y = jax.lax.conv_general_dilated(a, b, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
      else:
        y = layers.conv2d(a, b, padding="SAME", impl=impl)
      return jnp.sum(y * y)
    return census.census_text(jax.jit(jax.vmap(jax.grad(one, argnums=(0, 1)))).lower(
        x, w).as_text())["convolutions"]
  ours, autodiff = lowered("xla"), lowered("lax")
  # the forward and the input gradient are the two 3x3 ones on both sides
  fwd = {f"fgc={S} bgc=1 window=3x3 stride=1x1 lhs_dilate=1x1": 2}
  assert autodiff == {**fwd, f"fgc={S} bgc=1 window=9x10 stride=1x1 lhs_dilate=1x1": 1}
  assert ours == {**fwd, f"fgc=1 bgc={S} window=9x10 stride=1x1 lhs_dilate=1x1": 1}


@pytest.mark.parametrize("stride,padding", [(1, "TORCH"), (2, "TORCH"), (2, "SAME")])
def test_depthwise_shifts_under_the_seed_vmap_equals_grouped(stride, padding):
  (y0, g0), (y1, g1) = _vmapped_case(layers.depthwise_conv2d, ("grouped", "shifts"), 3,
                                     5, 5, stride, padding)
  assert float(jnp.abs(y0).max()) > 0.1
  chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("grad", layers.IM2COL_GRADS)
def test_im2col_keeps_the_input_not_its_patches(grad):
  """The backward of an im2col convolution holds the input, not the patch
  matrix nine times its size (the residuals of ``jax.vjp``), whichever
  form its kernel gradient takes."""
  x = jnp.ones((4, 16, 16, 8))
  w = jnp.ones((3, 3, 8, 8))
  _, vjp = jax.vjp(lambda a, b: layers.conv2d(a, b, impl="im2col", im2col_grad=grad), x, w)
  held = sum(leaf.size for leaf in jax.tree.leaves(vjp))
  assert held <= x.size + w.size + 64, held


@pytest.mark.parametrize("kernel,stride,padding", [
    (3, 1, "TORCH"), (3, 2, "TORCH"), (3, 2, "SAME"), (5, 1, "SAME"), (5, 2, "VALID")])
def test_one_channel_im2col_under_the_seed_vmap_equals_xla(kernel, stride, padding):
  """Both one-channel forms (a Fashion-MNIST stem), per-seed inputs and
  weights, the gradient inside the vmap."""
  for narrow in layers.IM2COL_NARROWS:
    (y0, g0), (y1, g1) = _vmapped_case(
        functools.partial(layers.conv2d, im2col_narrow=narrow), ("xla", "im2col"),
        kernel, 1, 4, stride, padding)
    assert float(jnp.abs(y0).max()) > 0.1
    chex.assert_trees_all_close((y1, g1), (y0, g0), rtol=2e-5, atol=2e-5)


def test_model_im2col_forms_reach_its_convolutions():
  """``model.im2col_grad`` and ``model.im2col_narrow`` set every im2col
  layer's forms: LeNet-5's gradient has one kernel-gradient product per 5x5
  tap of conv2 under ``taps`` (and of conv1 too where it is a patch
  matrix); its one-channel conv1 stacks its taps tap-major under
  ``stacked`` and channel-minor under ``patches``; every combination gives
  the same gradient."""
  from jsfl.models import get_model
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 28, 28, 1)), jnp.float32)
  grads, texts = {}, {}
  for grad_form in layers.IM2COL_GRADS:
    for narrow in layers.IM2COL_NARROWS:
      model = get_model("lenet5", (28, 28, 1), 10, conv_impl="im2col",
                        im2col_grad=grad_form, im2col_narrow=narrow)
      params, stats = model.init(jax.random.key(0))

      def loss(p, model=model, stats=stats):
        return jnp.sum(model.apply(p, stats, x, train=True)[0] ** 2)

      grad = jax.jit(jax.grad(loss))
      texts[grad_form, narrow] = grad.lower(params).as_text()
      grads[grad_form, narrow] = grad(params)
  dots = {k: t.count("dot_general") for k, t in texts.items()}
  assert dots["taps", "stacked"] == dots["patches", "stacked"] + 24, dots
  assert dots["taps", "patches"] == dots["patches", "patches"] + 2 * 24, dots
  for g in layers.IM2COL_GRADS:
    assert "-> tensor<25x4x28x28x1xf32>" in texts[g, "stacked"]
    assert "-> tensor<4x28x28x25xf32>" not in texts[g, "stacked"]
    assert "-> tensor<4x28x28x25xf32>" in texts[g, "patches"]
  first = grads["patches", "patches"]
  for k, g in grads.items():
    chex.assert_trees_all_close(g, first, rtol=1e-4, atol=1e-5, custom_message=str(k))
  with pytest.raises(ValueError, match="im2col_grad='cols'; allowed: auto, patches, taps"):
    get_model("lenet5", (28, 28, 1), 10, im2col_grad="cols")
  with pytest.raises(ValueError, match="im2col_narrow='x'; allowed: auto, stacked, patches"):
    get_model("lenet5", (28, 28, 1), 10, im2col_narrow="x")


def test_im2col_kernel_gradient_form_per_backend():
  """The patch matrix on the CPU (one matmul: 1.3-1.6x the rate of the taps
  there), the taps elsewhere (memory); a bad name is refused."""
  assert layers.default_im2col_grad("cpu") == "patches"
  assert layers.default_im2col_grad("gpu") == layers.default_im2col_grad("cuda") == "taps"
  assert layers.default_im2col_narrow("cpu") == "stacked"
  assert layers.default_im2col_narrow("gpu") == "patches"
  with pytest.raises(ValueError, match="im2col_grad='cols'; allowed"):
    layers.conv2d(jnp.ones((1, 4, 4, 1)), jnp.ones((3, 3, 1, 1)), impl="im2col",
                  im2col_grad="cols")
  with pytest.raises(ValueError, match="im2col_narrow='sum'; allowed"):
    layers.conv2d(jnp.ones((1, 4, 4, 1)), jnp.ones((3, 3, 1, 1)), impl="im2col",
                  im2col_narrow="sum")


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


def _rel(a, b):
  return float(jnp.linalg.norm(a.astype(jnp.float32) - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("layer", ["conv3x3", "conv1x1", "depthwise", "batch_norm"])
def test_bfloat16_layers_are_float32_to_bfloat16_rounding(layer):
  """Each training layer in bfloat16 (inputs, weights and cotangent cast)
  against float32: values and gradients within bfloat16's rounding (its
  8-bit mantissa: ~4e-3 a value), BatchNorm's statistics in float32."""
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (8, 16, 16, 8))
  fns = {
      "conv3x3": (lambda a, w: layers.conv2d(a, w, stride=2, padding="TORCH",
                                              impl="im2col"), (3, 3, 8, 8)),
      "conv1x1": (lambda a, w: layers.conv2d(a, w, impl="im2col"), (1, 1, 8, 8)),
      "depthwise": (lambda a, w: layers.depthwise_conv2d(a, w, stride=2, padding="TORCH",
                                                          impl="shifts"), (3, 3, 1, 8)),
      "batch_norm": (lambda a, w: layers._batch_norm_train(
          a.reshape(-1, 8), jnp.ones((a.size // 8,)), w, w * 0.5, 1e-5)[0].reshape(a.shape),
          (8,)),
  }
  f, wshape = fns[layer]
  w = jax.random.normal(k[1], wshape) + (1.0 if layer == "batch_norm" else 0.0)
  ct = jax.random.normal(k[2], jax.eval_shape(f, x, w).shape)

  @functools.partial(jax.jit, static_argnums=0)  # as a round runs it; eagerly an op a compile
  def value_and_vjp(dtype):
    y, vjp = jax.vjp(f, x.astype(dtype), w.astype(dtype))
    return y, vjp(ct.astype(dtype))

  (y0, g0), (y1, g1) = value_and_vjp(jnp.float32), value_and_vjp(jnp.bfloat16)
  assert y1.dtype == jnp.bfloat16
  for a, b in ((y1, y0), *zip(g1, g0, strict=True)):
    assert 1e-4 < _rel(a, b) < 1.5e-2


def test_bfloat16_training_keeps_float32_state():
  """exec.precision = bfloat16: the round's matmuls run in bfloat16 while
  parameters, statistics, optimiser state and loss stay float32; the
  default program has no bfloat16 at all; the two rounds agree to
  bfloat16's rounding of a small network."""
  data = make_fed_data([7, 5, 10], dominant=np.arange(3, dtype=np.int32))
  key = jax.random.key(2)
  out = {}
  for precision in ("float32", "bfloat16"):
    model = dataclasses.replace(tiny_model(), precision=precision)
    setup = make_setup(model, data, order="cyclic")
    state = sfl.init(setup, key)
    step = jax.jit(lambda s, k, setup=setup: sfl.round(setup, s, data, k))
    text = step.lower(state, key).as_text()
    assert ("bf16" in text) == (precision == "bfloat16")
    state, m = step(state, key)
    assert {a.dtype for a in jax.tree.leaves(state)
            if jnp.issubdtype(a.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}
    assert m["loss"].dtype == jnp.float32
    out[precision] = (state, m)
  (s32, m32), (s16, m16) = out["float32"], out["bfloat16"]
  assert abs(float(m16["loss"]) - float(m32["loss"])) < 0.02 * float(m32["loss"])
  moved = _rel(jax.flatten_util.ravel_pytree(s16.part2)[0] - jax.flatten_util.ravel_pytree(
      sfl.init(setup, key).part2)[0], jax.flatten_util.ravel_pytree(s32.part2)[0]
      - jax.flatten_util.ravel_pytree(sfl.init(setup, key).part2)[0])
  assert 1e-4 < moved < 0.1, moved


SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=160", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "partition.num_clients=4", "method.batch_size=16", "exec.progress=false",
       "run.rounds=2", "run.seeds=3", "exec.seed_exec=vmap"]


def _records(run_dir):
  import json
  with open(f"{run_dir}/metrics.jsonl") as f:
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]


def test_a_run_in_chunks_of_its_slots_equals_one_program(tmp_path, capsys):
  """Three seeds called two at a time (exec.max_slots = 2: the form a run
  takes when its program would not fit the device) give the records of one
  program of three, bit for bit."""
  from jsfl import cli
  assert cli.main(["run", *SYN, f"run.dir={tmp_path}/one"]) == 0
  assert cli.main(["run", *SYN, f"run.dir={tmp_path}/chunks", "exec.max_slots=2"]) == 0
  assert "running the slots 2 at a time (2 calls a round)" in capsys.readouterr().err
  one, chunks = _records(f"{tmp_path}/one"), _records(f"{tmp_path}/chunks")
  assert len(one) == 6 and {r["seed"] for r in one} == {0, 1, 2}
  assert one == chunks


def test_a_program_that_cannot_fit_stops_before_training(tmp_path, capsys, monkeypatch):
  """One slot needing more than the device has: one line naming the need
  and the device's memory, exit 2, no run directory left; a device that
  holds two of three slots runs them in chunks."""
  from jsfl import cli
  from jsfl.train import fit, memory
  monkeypatch.setattr(memory, "device_memory", lambda: 2**10)
  assert cli.main(["run", *SYN, f"run.dir={tmp_path}/run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "the round program of one slot needs" in err[0], err
  assert "the device has 0.00 GiB" in err[0] and "allowed:" in err[0]
  assert not os.path.exists(f"{tmp_path}/run")
  # a limit between two and three slots' needs
  from jsfl import config as config_lib
  from jsfl.train import experiment, programs
  cfg = config_lib.load_config(None, SYN)
  exp = experiment.prepare(cfg)
  init, rnd, _ = programs.build_programs(exp)
  slot, shared = programs.split_data(exp.data)
  keys = programs.make_seed_keys(exp.seeds)
  needs = [fit.program_bytes(fit.compile_round(rnd, init, keys, slot, shared, k))
           for k in (2, 3)]
  monkeypatch.setattr(memory, "device_memory",
                      lambda: int((needs[0] + needs[1]) / 2 / fit.USABLE))
  assert cli.main(["run", *SYN, f"run.dir={tmp_path}/fits"]) == 0
  assert "running the slots 2 at a time" in capsys.readouterr().err
  assert len(_records(f"{tmp_path}/fits")) == 6
