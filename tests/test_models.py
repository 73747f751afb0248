"""Tests of the conv lowerings and the model zoo (lenet5, mobilenet_v1, resnet18;
resnet101 and densenet161 in the slow suite where a test compiles them).

Cost notes (2 CPU cores): compiling dominates, not running.  Models are built
narrow (width 1/8); each (model, mode) compiles one program that runs the full
forward and the splits together, cached and shared between tests; parameters
for forward tests come from numpy (compiling ``model.init``'s random
initialisers costs about a second per parameter shape).  The structural tests
use the ``xla``/``grouped`` lowerings, whose programs compile several times
faster than ``im2col``/``shifts`` ones; the lowerings are compared with each
other separately.  The heaviest duplicates are marked ``slow``, and so is
every structural test of the deep models (ResNet-101, DenseNet-161: their
programs take tens of seconds each to compile here); their PyTorch check, a
training step at full depth, is in the fast suite.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsfl.models import densenet161, get_model, layers, mobilenet_v1, resnet18, resnet101

SHAPES = [(32, 32, 3), (28, 28, 1)]
NUM_CLASSES = 7
WIDTH = {"lenet5": {}, "mobilenet_v1": {"width": 0.125},
         "resnet18": {"width": 0.125}, "resnet101": {"width": 0.125},
         "densenet161": {"width": 0.125}}
DEEP = ["resnet101", "densenet161"]
NAMES = [name for name in WIDTH if name not in DEEP]
MODELS = [(name, shape) for name in NAMES for shape in SHAPES]
# the deep models, for the slow suite
DEEP_MODELS = [pytest.param(name, shape, marks=pytest.mark.slow)
               for name in DEEP for shape in SHAPES]
DEEP_NAMES = [pytest.param(name, marks=pytest.mark.slow) for name in DEEP]
XLA = {"conv_impl": "xla", "depthwise_impl": "grouped"}
FAST_CPU = {"conv_impl": "im2col", "depthwise_impl": "shifts"}


def _model(name, shape, **options):
  return get_model(name, shape, NUM_CLASSES, **{**WIDTH[name], **options})


@functools.cache
def _init(model, seed=0):
  """Random ``(params, stats)`` shaped like ``model.init``'s, from numpy.

  ``model.init`` compiles one random-number program per parameter shape
  (seconds each here); the forward tests need only generic values: He-normal
  kernels, scales and biases near 1 and 0, and running statistics away from
  their initial 0 / 1 so that eval-mode BatchNorm is not an identity.
  """
  rng = np.random.default_rng(seed)

  def fill(path, a):
    name = jax.tree_util.keystr(path)
    noise = rng.normal(size=a.shape).astype(np.float32)
    if "kernel" in name:
      return noise * np.float32(math.sqrt(2.0 / math.prod(a.shape[:-1])))
    if "scale" in name or "var" in name:
      return 1.0 + 0.1 * np.abs(noise)
    return 0.1 * noise  # biases and running means

  return jax.tree_util.tree_map_with_path(fill, model.shapes())


@functools.cache
def _fn(model, start, train):
  """``model.apply`` from stage ``start``, jitted once per model and mode."""
  return jax.jit(functools.partial(model.apply, start=start, train=train))


def _run(model, params, stats, x, a=0, b=None, *, train, mask=None):
  """Runs stages ``[a, b)`` through the shared jitted apply."""
  b = model.num_stages if b is None else b
  return _fn(model, a, train)(params[a:b], stats[a:b], x, mask=mask)


def _batch(shape, n=4, seed=0):
  return np.random.default_rng(100 + seed).normal(
      size=(n,) + shape).astype(np.float32)


def _close(a, b, rtol=1e-5, atol=1e-5):
  chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- lowerings


def _lowering_cases(fn, impls, kernel, kernel_io, channels):
  """Values and input/kernel gradients of ``fn`` under two impls, jitted.

  Covers strides 1 and 2 with SAME and VALID padding on a 9x10 input (odd
  and even sizes); inputs come from numpy so that no random-number program
  has to be compiled.
  """
  rng = np.random.default_rng(kernel)
  w = rng.normal(size=(kernel, kernel) + kernel_io).astype(np.float32) / kernel
  x = rng.normal(size=(2, 9, 10, channels)).astype(np.float32)
  cases = [(s, p) for s in (1, 2) for p in layers.PADDINGS]
  cots = []
  for s, p in cases:
    shape = jax.eval_shape(functools.partial(
        fn, stride=s, padding=p, impl=impls[0]), x, w).shape
    cots.append(rng.normal(size=shape).astype(np.float32))

  @jax.jit
  def run(x, w, cots):
    results = []
    for (s, p), cot in zip(cases, cots):
      outs, grads = [], []
      for impl in impls:
        f = functools.partial(fn, stride=s, padding=p, impl=impl)
        y, vjp = jax.vjp(f, x, w)
        outs.append(y)
        grads.append(vjp(cot))
      results.append((outs, grads))
    return results

  return cases, run(x, w, cots)


@pytest.mark.parametrize("form", layers.IM2COL_GRADS + layers.IM2COL_NARROWS)
@pytest.mark.parametrize("kernel", [1, 3, 5, 7])
def test_conv2d_im2col_matches_xla_values_and_grads(kernel, form):
  """Every form of im2col (the backend picks them): both kernel gradients
  over three channels, both one-channel lowerings over one."""
  narrow = form in layers.IM2COL_NARROWS
  conv = functools.partial(layers.conv2d, **{"im2col_narrow" if narrow else "im2col_grad": form})
  channels = 1 if narrow else 3
  cases, results = _lowering_cases(conv, ("xla", "im2col"), kernel, (channels, 4), channels)
  for (stride, padding), (outs, grads) in zip(cases, results):
    if padding in ("SAME", "TORCH"):  # odd kernels: the same shapes
      expect = (2, -(-9 // stride), -(-10 // stride), 4)
    else:
      expect = (2, (9 - kernel) // stride + 1, (10 - kernel) // stride + 1, 4)
    chex.assert_shape(outs, expect)
    assert float(jnp.abs(outs[0]).max()) > 0.1
    _close(outs[1], outs[0])
    _close(grads[1], grads[0])  # w.r.t. input and kernel


# The models use 3x3 depthwise kernels only; 5x5 is in the slow suite.
@pytest.mark.parametrize("kernel", [3, pytest.param(5, marks=pytest.mark.slow)])
def test_depthwise_shifts_matches_grouped_values_and_grads(kernel):
  cases, results = _lowering_cases(layers.depthwise_conv2d,
                                   ("grouped", "shifts"), kernel, (1, 5), 5)
  for _, (outs, grads) in zip(cases, results):
    chex.assert_equal_shape(outs)
    assert float(jnp.abs(outs[0]).max()) > 0.1
    _close(outs[1], outs[0])
    _close(grads[1], grads[0])


def test_depthwise_lowerings_agree_inside_a_split_round():
  """The shifted depthwise layers' hand-written VJP (kernel gradient as a
  matmul per tap) inside a whole SFL round, ragged clients (padded, masked
  batches; each client's part-1 inside the server's visit of it, so
  ``client_exec`` vmap and unroll lower to the same program): the same
  round as XLA's grouped convolution.  A layer-level check cannot see this: XLA:CPU has been seen to
  compile a ``ones @ x`` column sum wrongly inside a round program (a
  BatchNorm VJP of that form; benchmarks/README.md) while the same product
  compiled alone was right.  GroupNorm: BatchNorm over one- or two-sample
  batches would amplify rounding beyond any tolerance, and without a norm
  this network barely trains in one round.  The shifted lowering compiles
  with XLA's default settings, under which that miscompile was seen; the
  grouped reference with the suite's, which compile faster (conftest.py)."""
  from conftest import DEFAULT_XLA, make_fed_data
  from loop_reference import make_setup

  from jsfl.methods import sfl
  data = make_fed_data([7, 5, 10], shape=(28, 28, 1))
  key = jax.random.key(3)
  states = []
  for dw in ("grouped", "shifts"):
    model = get_model("mobilenet_v1", (28, 28, 1), 4, width=0.125, conv_impl="im2col",
                      depthwise_impl=dw, norm="group")
    setup = make_setup(model, data, cut=4)
    state = sfl.init(setup, key)
    rnd = jax.jit(lambda s, k, setup=setup: sfl.round(setup, s, data, k))
    options = DEFAULT_XLA if dw == "shifts" else None
    states.append(rnd.lower(state, key).compile(options)(state, key)[0])
  start, checked = sfl.init(setup, key), 0
  # every depthwise kernel of part-1 and of the server portion trained
  for before, after in ((start.part1, states[0].part1), (start.part2, states[0].part2)):
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
      if a.ndim == 4 and a.shape[:3] == (3, 3, 1):
        checked += 1
        assert float(jnp.abs(a - b).max()) > 1e-2
  assert checked == 14  # the 13 depthwise layers and the one-channel stem
  # rounding of the two lowerings, through GroupNorm; a wrong sum is ~1e-3
  chex.assert_trees_all_close(states[1], states[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", layers.CONV_IMPLS)
def test_torch_padding_is_kernel_half_on_every_side(impl):
  """TORCH = zero-pad ``k // 2`` on every side, then VALID (PyTorch's
  ``padding=k // 2``); at stride 2 on an even size SAME pads (0, 1) instead,
  another function with the same output shape."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, 8, 10, 4)).astype(np.float32)
  w = rng.normal(size=(3, 3, 4, 5)).astype(np.float32)
  dw = rng.normal(size=(3, 3, 1, 4)).astype(np.float32)
  padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  for stride in (1, 2):
    conv = layers.conv2d(x, w, stride=stride, padding="TORCH", impl=impl)
    _close(conv, layers.conv2d(padded, w, stride=stride, padding="VALID", impl="xla"))
    depth = layers.depthwise_conv2d(x, dw, stride=stride, padding="TORCH",
                                    impl="shifts" if impl == "im2col" else "grouped")
    _close(depth, layers.depthwise_conv2d(padded, dw, stride=stride,
                                          padding="VALID", impl="grouped"))
    same = layers.conv2d(x, w, stride=stride, padding="SAME", impl=impl)
    chex.assert_equal_shape([conv, same])
    assert np.allclose(conv, same, atol=1e-4) == (stride == 1)
  with pytest.raises(ValueError, match="padding='FULL'; allowed: SAME, VALID, TORCH"):
    layers.conv2d(x, w, padding="FULL", impl=impl)


@pytest.mark.parametrize("name", [
    "small_cnn", "lenet5", "alexnet", "vgg16", "mobilenet_v1", "resnet18",
    pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_padding_changes_exactly_the_models_config_lists(name):
  """``padding="torch"`` (the default) against XLA's SAME on Fashion-MNIST's
  28x28 (even down to 14 on every stride-2 model): another function exactly
  on the models whose stored configs without ``model.padding`` are read as
  ``same`` (``config.PADDING_SENSITIVE_MODELS``); the parameters are shared."""
  from jsfl import config
  kw = {"width": 0.125} if name in ("mobilenet_v1", "mobilenet_v2", "resnet18", "vgg16") else {}
  shape = SHAPES[1]
  torch_m = get_model(name, shape, NUM_CLASSES, **kw, **XLA)
  same_m = get_model(name, shape, NUM_CLASSES, padding="same", **kw, **XLA)
  assert torch_m.padding == "torch" and same_m.padding == "same"
  params, stats = _init(torch_m)
  chex.assert_trees_all_equal_shapes(params, _init(same_m)[0])
  x = _batch(shape, n=2)
  a, b = (jax.jit(lambda p, s, x, m=m: m.apply(p, s, x, train=True)[0])(params, stats, x)
          for m in (torch_m, same_m))
  assert (not np.allclose(a, b, rtol=1e-4, atol=1e-4)) == (
      name in config.PADDING_SENSITIVE_MODELS)
  with pytest.raises(ValueError, match="padding='valid'; allowed: torch, same"):
    get_model(name, SHAPES[0], NUM_CLASSES, padding="valid", **kw)


def test_lowering_names_are_validated():
  x, w = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 2))
  with pytest.raises(ValueError, match="'fft'"):
    layers.conv2d(x, w, impl="fft")
  with pytest.raises(ValueError, match="'loop'"):
    layers.depthwise_conv2d(x, jnp.ones((3, 3, 1, 2)), impl="loop")


# ------------------------------------------------------------------- models


@functools.cache
def _splits_fn(model, train):
  """One jitted program: the full forward, every stage run on its own from its
  index (the output of ``[0, c)`` fed to ``apply(start=c)``, i.e. every cut),
  and the 3-portion (Hydra) split at the default cuts.

  One program instead of one per cut keeps compile time to about that of a
  single forward pass.
  """
  c, cb = model.default_cut, model.default_head_cut

  def run(params, stats, x):
    full, full_stats = model.apply(params, stats, x, train=train)
    h, chain_stats = x, ()
    for i in range(model.num_stages):
      h, st = model.apply(params[i:i + 1], stats[i:i + 1], h, start=i,
                          train=train)
      chain_stats += st
    chain = h
    h, s1 = model.apply(params[:c], stats[:c], x, train=train)
    h, s2 = model.apply(params[c:cb], stats[c:cb], h, start=c, train=train)
    split, s3 = model.apply(params[cb:], stats[cb:], h, start=cb, train=train)
    return full, full_stats, chain, chain_stats, split, s1 + s2 + s3

  return jax.jit(run)


def _check_splits(m, params, stats, x, *, train):
  """Asserts the split forwards equal the full one; returns its outputs."""
  full, full_stats, chain, chain_stats, split, split_stats = _splits_fn(
      m, train)(params, stats, x)
  chex.assert_shape(full, (x.shape[0], NUM_CLASSES))
  chex.assert_tree_all_finite(full)
  assert float(jnp.std(full)) > 1e-3  # not a constant map
  _close(chain, full, rtol=1e-5, atol=1e-6)
  _close(split, full, rtol=1e-5, atol=1e-6)
  _close(chain_stats, full_stats, rtol=1e-5, atol=1e-6)
  _close(split_stats, full_stats, rtol=1e-5, atol=1e-6)
  return full, full_stats


@pytest.mark.parametrize("name,shape", MODELS + DEEP_MODELS)
def test_split_forward_equals_full_forward_eval(name, shape):
  m = _model(name, shape, **XLA)
  params, stats = _init(m)
  _, new_stats = _check_splits(m, params, stats, _batch(shape), train=False)
  chex.assert_trees_all_equal(new_stats, stats)  # eval leaves stats alone


@pytest.mark.parametrize("name,shape", MODELS + DEEP_MODELS)
def test_split_forward_equals_full_forward_train_group_norm(name, shape):
  m = _model(name, shape, norm="group", **XLA)
  params, stats = _init(m, 1)
  assert not jax.tree.leaves(stats)  # GroupNorm keeps no statistics
  _check_splits(m, params, stats, _batch(shape, seed=1), train=True)


def _bn_model(name, shape):
  # mobilenet_v1 and resnet18 default to BatchNorm: reuse the eval test's
  # model object and so its compiled programs.
  norm = {"norm": "batch"} if name == "lenet5" else {}
  return _model(name, shape, **norm, **XLA)


@pytest.mark.parametrize("name", NAMES + DEEP_NAMES)
def test_batch_norm_stats_update_only_in_train_mode(name):
  shape = SHAPES[0]
  m = _bn_model(name, shape)
  params, stats = _init(m)
  x = 3.0 + _batch(shape)
  _, eval_stats = _check_splits(m, params, stats, x, train=False)
  chex.assert_trees_all_equal(eval_stats, stats)
  # Training splits agree too, statistics included.
  _, new_stats = _check_splits(m, params, stats, x, train=True)
  chex.assert_trees_all_equal_structs(new_stats, stats)
  for i, (old, new) in enumerate(zip(stats, new_stats)):
    for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
      assert not np.allclose(a, b), f"stage {i} statistics did not move"
  # Momentum 0.9: the first BN's running mean moves a tenth of the way to
  # the batch mean of its input, the stem conv's output (a stage of its own
  # in resnet18 and resnet101).
  first = next(i for i, s in enumerate(stats) if jax.tree.leaves(s))
  assert first == (1 if name in ("resnet18", "resnet101") else 0)
  kernel = (params[0]["conv"] if first == 0 else params[0])["kernel"]
  pre = layers.conv2d(x, kernel, impl="xla")
  means = [[a for p, a in jax.tree_util.tree_leaves_with_path(st[first])
            if "mean" in jax.tree_util.keystr(p)] for st in (stats, new_stats)]
  assert len(means[0]) == 1
  _close(means[1][0], 0.9 * means[0][0] + 0.1 * pre.mean((0, 1, 2)),
         rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES + DEEP_NAMES)
def test_mask_keeps_padding_out_of_batch_norm_stats(name):
  shape = SHAPES[0]
  m = _bn_model(name, shape)
  params, stats = _init(m)
  x = 3.0 + _batch(shape)
  garbage = 50.0 * _batch(shape, n=3, seed=4) + 20.0
  padded = jnp.concatenate([x, garbage])
  mask = jnp.arange(7) < 4
  ref_y, ref_stats = _check_splits(m, params, stats, x, train=True)
  y, got_stats = _run(m, params, stats, padded, train=True, mask=mask)
  _close(got_stats, ref_stats, rtol=1e-4, atol=1e-5)
  _close(y[:4], ref_y, rtol=1e-4, atol=1e-4)
  # The garbage rows would move the statistics if they were let in.
  _, all_in = _run(m, params, stats, padded, train=True, mask=jnp.ones(7, bool))
  assert not np.allclose(jax.tree.leaves(all_in)[0],
                         jax.tree.leaves(ref_stats)[0], rtol=1e-2)


def _check_vmapped_init(m):
  keys = jax.random.split(jax.random.key(4), 3)
  # one program: an eager init compiles a random draw per parameter shape
  init = jax.jit(jax.vmap(m.init))
  params, stats = init(keys)
  chex.assert_trees_all_equal_structs((params, stats), _init(m))
  kernels = [(jax.tree_util.keystr(p), a)
             for p, a in jax.tree_util.tree_leaves_with_path(params)
             if "kernel" in jax.tree_util.keystr(p)]
  assert len(kernels) >= 5
  for name, k in kernels:
    assert k.shape[0] == 3
    for i, j in ((0, 1), (0, 2), (1, 2)):
      assert not np.allclose(k[i], k[j]), f"{name}: seeds {i}, {j} agree"
  # The largest kernel's spread is that of its initialiser (He-normal for
  # convs, LeCun-normal for dense layers), not that of a constant.
  name, k = max(kernels, key=lambda nk: nk[1].size)
  fan_in = math.prod(k.shape[1:-1])
  assert 0.5 / math.sqrt(fan_in) < float(np.std(k[2])) < 2.0 / math.sqrt(fan_in)
  chex.assert_trees_all_equal(init(keys), (params, stats))


def test_vmapped_init_gives_different_params_per_key():
  # Compiling random initialisers is slow on CPU (about a second per
  # parameter shape here); the key plumbing is shared by every StagedModel,
  # so the fast suite checks the values on lenet5 and the traced shapes of
  # the others (the slow suite checks their values).
  _check_vmapped_init(_model("lenet5", SHAPES[1], **XLA))
  keys = jax.random.split(jax.random.key(4), 3)
  for name in ("mobilenet_v1", "resnet18"):
    m = _model(name, SHAPES[0], **XLA)
    abstract = jax.eval_shape(jax.vmap(m.init), keys)
    single = jax.eval_shape(m.init, keys[0])
    chex.assert_trees_all_equal_structs(abstract, single)
    # what the library reads instead of tracing init
    chex.assert_trees_all_equal_shapes_and_dtypes(m.shapes(), single)
    for a, b in zip(jax.tree.leaves(abstract), jax.tree.leaves(single)):
      assert a.shape == (3,) + b.shape


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v1", "resnet18"])
def test_vmapped_init_gives_different_params_per_key_large(name):
  _check_vmapped_init(_model(name, SHAPES[0], **XLA))


def _check_impls_agree(name, shape, train):
  a = _model(name, shape, **XLA)
  b = _model(name, shape, **FAST_CPU)
  params, stats = _init(a)
  chex.assert_trees_all_equal_structs(
      jax.eval_shape(b.init, jax.random.key(0)), (params, stats))
  x = _batch(shape, seed=5)
  ya, sa = _run(a, params, stats, x, train=train)
  yb, sb = _run(b, params, stats, x, train=train)
  # BatchNorm over 4 samples at 2x2 amplifies float32 rounding in training.
  tol = 1e-4 if train else 1e-5
  _close(yb, ya, rtol=1e-4, atol=tol)
  _close(sb, sa, rtol=1e-4, atol=tol)


# im2col programs of resnet18 take seconds to compile; one of its input
# shapes is in the slow suite.
@pytest.mark.parametrize("name,shape", [
    pytest.param(n, s, marks=pytest.mark.slow) if (n, s) == (
        "resnet18", SHAPES[1]) else (n, s) for n, s in MODELS] + DEEP_MODELS)
def test_conv_and_depthwise_impls_give_same_logits(name, shape):
  _check_impls_agree(name, shape, train=False)


@pytest.mark.slow
@pytest.mark.parametrize("name,shape", MODELS)
def test_conv_and_depthwise_impls_agree_in_training(name, shape):
  _check_impls_agree(name, shape, train=True)


def _n_params(model):
  abstract = model.shapes()[0]
  return sum(math.prod(a.shape) for a in jax.tree.leaves(abstract))


def test_full_size_parameter_counts():
  # Classic LeNet-5 on 28x28x1: 156 + 2416 + 48120 + 10164 + 850.
  assert _n_params(get_model("lenet5", (28, 28, 1), 10)) == 61706
  # FedSeq's authors' LeNet-5, conv1 unpadded: 16 * 4 * 4 = 256 features into fc1.
  valid = get_model("lenet5", (28, 28, 1), 10, conv1_padding="valid")
  assert _n_params(valid) == 156 + 2416 + 30840 + 10164 + 850
  p = valid.shapes()[0]
  assert [a.shape for a in jax.tree.leaves(p) if len(a.shape) == 2][0] == (256, 120)
  with pytest.raises(ValueError, match=r"too small .* allowed: H and W at least 16"):
    get_model("lenet5", (15, 15, 1), 10, conv1_padding="valid")
  with pytest.raises(ValueError, match="conv1_padding='full'; allowed: same, valid"):
    get_model("lenet5", (28, 28, 1), 10, conv1_padding="full")
  # 32x32 inputs reach fc1 at 6x6: 16 * 36 * 120 + 120 for fc1.
  assert _n_params(get_model("lenet5", (32, 32, 3), 10)) == (
      456 + 2416 + 69240 + 10164 + 850)
  # CIFAR ResNet-18 with 10 classes (the widely quoted 11,173,962).
  assert _n_params(get_model("resnet18", (32, 32, 3), 10)) == 11173962
  # MobileNetV1: stem + BN, 13 x (dw + BN + pw + BN), classifier.
  expect, c = 3 * 3 * 3 * 32 + 2 * 32, 32
  for cout, _ in mobilenet_v1.BLOCKS:
    expect += 9 * c + 2 * c + c * cout + 2 * cout
    c = cout
  expect += 1024 * 10 + 10
  assert _n_params(get_model("mobilenet_v1", (32, 32, 3), 10)) == expect


def test_documented_stages_and_cuts():
  mb = _model("mobilenet_v1", SHAPES[0], **XLA)
  assert mb.num_stages == 28
  assert mb.stage_names[:5] == ("stem", "dw1", "pw1", "dw2", "pw2")
  assert mb.stage_names[-3:] == ("dw13", "pw13", "classifier")
  assert (mb.default_cut, mb.default_head_cut) == (4, 26)
  assert mobilenet_v1.CUTS == {"shallow": 4, "mid": 15, "deep": 23}
  assert mobilenet_v1.HEAD_CUTS == {"small": 26, "large": 20}
  rn = _model("resnet18", SHAPES[0], **XLA)
  assert rn.num_stages == 12
  assert rn.stage_names[:4] == ("conv1", "bn1", "block1", "block2")
  assert rn.stage_names[-2:] == ("avgpool", "fc")
  assert (rn.default_cut, rn.default_head_cut) == (4, 10)
  assert resnet18.CUTS == {"shallow": 2, "mid": 6, "deep": 10}
  ln = _model("lenet5", SHAPES[1], **XLA)
  assert ln.stage_names == ("conv1", "conv2", "fc1", "fc2", "fc3")
  assert (ln.default_cut, ln.default_head_cut) == (2, 4)
  # What the client sends at the default cuts (shapes only, nothing runs).
  x = jax.ShapeDtypeStruct((4,) + SHAPES[0], jnp.float32)
  for m, expect in ((mb, (4, 16, 16, 8)), (rn, (4, 32, 32, 8))):
    p, s = jax.eval_shape(m.init, jax.random.key(0))
    c = m.default_cut
    h = jax.eval_shape(lambda p, s, x, m=m, c=c: m.apply(
        p[:c], s[:c], x, train=False)[0], p, s, x)
    assert h.shape == expect
  p, s = jax.eval_shape(ln.init, jax.random.key(0))
  h = jax.eval_shape(lambda p, s, x: ln.apply(p[:2], s[:2], x, train=False)[0],
                     p, s, jax.ShapeDtypeStruct((4, 28, 28, 1), jnp.float32))
  assert h.shape == (4, 5, 5, 16)


def test_a_factory_may_build_another_model_through_get_model():
  """get_model builds a factory's model once, as a draft it then completes;
  a model the factory itself takes from get_model comes back whole."""
  from jsfl.models import base
  inner = {}

  @base.register("_wraps_small_cnn")
  def wraps(input_shape, num_classes, **_):
    m = get_model("small_cnn", input_shape, num_classes, init="he_lecun", padding="same")
    inner["stages"] = m.num_stages  # a draft has no stages to count
    return dataclasses.replace(m, name="_wraps_small_cnn")
  try:
    outer = get_model("_wraps_small_cnn", (28, 28, 1), 10)
    assert inner["stages"] == outer.num_stages == 4
    chex.assert_trees_all_equal_shapes_and_dtypes(
        outer.shapes(), jax.eval_shape(outer.init, jax.random.key(0)))
  finally:
    base._REGISTRY.pop("_wraps_small_cnn")


def test_deep_models_documented_stages_cuts_and_sizes():
  """ResNet-101's 37 stages are the Hydra paper's 37 layers, cut where it cuts
  (2, 10, 33; heads from 33 or 30); DenseNet-161 has a stage per dense layer
  and transition, cut after the transitions.  At full size each has
  torchvision's parameter count less the small-image stem's saving
  (conv3x3 for conv7x7) and the classes' (docs/models.md)."""
  rn = _model("resnet101", SHAPES[0], width=1.0, **XLA)
  assert rn.num_stages == 37
  assert rn.stage_names[:3] == ("conv1", "bn1", "block1")
  assert rn.stage_names[-3:] == ("block33", "avgpool", "fc")
  assert (rn.default_cut, rn.default_head_cut) == (2, 33)
  assert resnet101.CUTS == {"shallow": 2, "mid": 10, "deep": 33}
  assert dict(rn.head_cuts) == resnet101.HEAD_CUTS == {"small": 33, "large": 30}
  dn = _model("densenet161", (64, 64, 3), width=1.0, **XLA)
  assert dn.num_stages == 84
  assert [dn.stage_names[i] for i in (0, 1, 6, 7, 8, 20, 21, 57, 81, 82, 83)] == [
      "stem", "dense1_1", "dense1_6", "transition1", "dense2_1", "transition2",
      "dense3_1", "transition3", "dense4_24", "norm5", "classifier"]
  assert (dn.default_cut, dn.default_head_cut) == (8, 82)
  assert densenet161.CUTS == {"shallow": 8, "mid": 21, "deep": 58}
  # (with NUM_CLASSES classes: 1000 - 7 fewer than torchvision's)
  assert _n_params(rn) == 44549160 - (49 - 9) * 3 * 64 - 993 * (2048 + 1)
  assert _n_params(dn) == 28681000 - (49 - 9) * 3 * 96 - 993 * (2208 + 1)

  def sent(m, shape, cuts):
    """What the client sends at each cut (shapes only, nothing runs)."""
    def chain(p, s, x):
      out = {}
      for i in range(max(cuts)):
        x = m.apply(p[i:i + 1], s[i:i + 1], x, start=i, train=False)[0]
        out[i + 1] = x
      return {c: out[c] for c in cuts}
    p, s = m.shapes()
    x = jax.ShapeDtypeStruct((2,) + shape, jnp.float32)
    return {c: h.shape[1:] for c, h in jax.eval_shape(chain, p, s, x).items()}

  # CIFAR reaches the pool at 4x4, TinyImageNet at 8x8
  assert sent(rn, SHAPES[0], (2, 10, 30, 33, 35)) == {
      2: (32, 32, 64), 10: (8, 8, 1024), 30: (8, 8, 1024), 33: (4, 4, 2048),
      35: (4, 4, 2048)}
  assert sent(dn, (64, 64, 3), (8, 21, 58, 82)) == {
      8: (32, 32, 192), 21: (16, 16, 384), 58: (8, 8, 1056), 82: (8, 8, 2208)}
  # DenseNet's transitions floor odd sides as PyTorch's pool does (28 -> 14
  # -> 7 -> 3); three of them need 8 pixels
  assert sent(_model("densenet161", SHAPES[1], **XLA), SHAPES[1], (82,)) == {
      82: (3, 3, 276)}
  with pytest.raises(ValueError, match=r"densenet161: input_shape=\(7, 7, 3\) is too "
                     "small.*allowed: H and W at least 8"):
    get_model("densenet161", (7, 7, 3), 10)


def test_inference_lowering_rule():
  # On the CPU a spatial conv over >= 8 channels evaluates through XLA's conv;
  # one- or three-channel stems and 1x1 convs keep the training lowering.
  rule = functools.partial(layers.inference_conv_impl, backend="cpu")
  assert rule("im2col", (3, 3, 16, 32)) == "xla"
  assert rule("im2col", (3, 3, 8, 8)) == "xla"
  assert rule("im2col", (3, 3, 3, 32)) == "im2col"
  assert rule("im2col", (3, 3, 1, 16)) == "im2col"
  assert rule("im2col", (1, 1, 64, 64)) == "im2col"
  assert rule("im2col", (3, 3, 16, 32), "same") == "im2col"
  assert rule("xla", (3, 3, 1, 16), "im2col") == "im2col"
  assert layers.inference_conv_impl("im2col", (3, 3, 16, 32), backend="gpu") == "im2col"
  with pytest.raises(ValueError, match="eval_conv_impl='fast'.*allowed"):
    rule("im2col", (3, 3, 16, 32), "fast")


def test_evaluation_forward_takes_its_own_lowering_with_the_same_values():
  """``logits`` (evaluation) runs the ``eval_conv_impl`` program on the very
  same parameters as training's lowering, to float tolerance; ``same`` is
  the training program itself."""
  name, shape = "lenet5", SHAPES[0]  # conv2: 5x5 over 6 channels -> xla when forced
  train_impl = _model(name, shape, **FAST_CPU, eval_conv_impl="same")
  forced = _model(name, shape, **FAST_CPU, eval_conv_impl="xla")
  params, stats = _init(train_impl)
  x = _batch(shape)
  convs = [n for n in _inference_nodes(forced) if isinstance(n, layers.Conv)]
  assert convs and all(n.impl == "xla" for n in convs)
  assert train_impl._inference_graphdefs is train_impl._graphdefs
  base = jax.jit(train_impl.logits)(params, stats, x)
  assert float(jnp.abs(base).max()) > 0.1
  _close(jax.jit(forced.logits)(params, stats, x), base)
  # training keeps its lowering: apply(train=False) without inference is it
  _close(_run(forced, params, stats, x, train=False)[0], base, rtol=0, atol=0)
  with pytest.raises(ValueError, match="inference=True needs train=False"):
    forced.apply(params, stats, x, train=True, inference=True)
  with pytest.raises(ValueError, match="eval_conv_impl='fft'.*allowed"):
    _model(name, shape, eval_conv_impl="fft")


def test_small_cnn_auto_evaluation_lowering_on_cpu():
  """The default rule on the CPU: conv1 (one channel) stays im2col, conv2
  (16 channels) evaluates through XLA; the logits equal training's."""
  if jax.default_backend() != "cpu":
    pytest.skip("the rule under test is the CPU's")
  shape = SHAPES[1]
  train_impl = get_model("small_cnn", shape, NUM_CLASSES, conv_impl="im2col",
                         eval_conv_impl="same")
  auto = get_model("small_cnn", shape, NUM_CLASSES, conv_impl="im2col")
  assert [n.impl for n in _inference_nodes(auto) if isinstance(n, layers.Conv)] == [
      "im2col", "xla"]
  params, stats = _init(train_impl)
  x = _batch(shape)
  base = jax.jit(train_impl.logits)(params, stats, x)
  _close(jax.jit(auto.logits)(params, stats, x), base)


def _inference_nodes(model):
  """The modules of ``model``'s evaluation program (on abstract state)."""
  from flax import nnx
  for g, (p, b) in zip(model._inference_graphdefs, model._abstract, strict=True):
    yield from (node for _, node in nnx.iter_graph(nnx.merge(g, p, b)))


@pytest.mark.parametrize("name", NAMES + DEEP)
@pytest.mark.parametrize("option,value", [
    ("norm", "layer"), ("conv_impl", "fft"), ("depthwise_impl", "loop")])
def test_get_model_rejects_bad_options(name, option, value):
  with pytest.raises(ValueError, match=f"{option}='{value}'.*allowed"):
    _model(name, SHAPES[0], **{option: value})


def test_get_model_rejects_bad_name_width_shape_and_classes():
  with pytest.raises(ValueError, match="'lenet6'.*allowed.*lenet5"):
    get_model("lenet6", (32, 32, 3), 10)
  for name in ("mobilenet_v1", "resnet18"):
    with pytest.raises(ValueError, match="width=0"):
      get_model(name, (32, 32, 3), 10, width=0)
  for bad in (1.5, 0, True):  # the small CNN's width is a channel count
    with pytest.raises(ValueError, match=rf"small_cnn: width={bad!r}; allowed: an int >= 1"):
      get_model("small_cnn", (28, 28, 1), 10, width=bad)
  with pytest.raises(ValueError, match=r"input_shape=\(8, 8, 1\)"):
    get_model("lenet5", (8, 8, 1), 10)
  with pytest.raises(ValueError, match=r"input_shape=\(32, 32\)"):
    get_model("resnet18", (32, 32), 10)
  with pytest.raises(ValueError, match="num_classes=0"):
    get_model("resnet18", (32, 32, 3), 0)


@pytest.mark.parametrize("name", NAMES + DEEP)
def test_check_cut_bounds(name):
  m = _model(name, SHAPES[0], **XLA)
  s = m.num_stages
  assert m.check_cut(1) == 1 and m.check_cut(s - 1) == s - 1
  assert m.check_cut(m.default_cut) == m.default_cut
  assert m.check_cut(m.default_head_cut, "cut_b") == m.default_head_cut
  for bad in (0, -1, s, s + 3):
    with pytest.raises(ValueError, match=rf"cut={bad}.*\[1, {s - 1}\]"):
      m.check_cut(bad)


# ---------------------------------------------------------- initialisation
@pytest.mark.parametrize("name", ["small_cnn", "mobilenet_v1", "resnet18", "lenet5",
                                  "alexnet", "vgg16",
                                  pytest.param("mobilenet_v2", marks=pytest.mark.slow)]
                         + DEEP_NAMES)
def test_torch_init_draws_like_pytorch(name):
  """``init="torch"``: every conv / dense weight and bias uniform in
  +-1/sqrt(fan_in) (PyTorch's defaults), normalisation scales 1, shifts 0.

  The draws are ``model.init``'s, jitted as a run traces them (one program;
  drawn eagerly, every parameter shape compiled its own random draw); an
  abstract build names the layer each parameter belongs to."""
  import operator

  from flax import nnx
  kw = {"width": 0.25} if name in ("mobilenet_v1", "resnet18", "vgg16", "mobilenet_v2",
                                   *DEEP) else {}
  shape = (28, 28, 1) if name in ("small_cnn", "lenet5") else (32, 32, 3)
  model = get_model(name, shape, 10, init="torch", **kw)
  params, _ = jax.device_get(jax.jit(model.init)(jax.random.key(0)))
  stages = nnx.eval_shape(lambda: model.build(nnx.Rngs(params=jax.random.key(0))))
  seen = 0
  for stage, p in zip(stages, params, strict=True):
    for path, node in nnx.iter_graph(stage):
      if not isinstance(node, (layers.Conv, layers.DepthwiseConv, nnx.Linear, nnx.BatchNorm)):
        continue
      leaves = functools.reduce(operator.getitem, path, p)
      if isinstance(node, nnx.BatchNorm):
        assert (np.asarray(leaves["scale"]) == 1).all()
        assert (np.asarray(leaves["bias"]) == 0).all()
        continue
      w = np.asarray(leaves["kernel"])
      assert w.shape == node.kernel.shape
      fan_in = math.prod(w.shape[:-1])
      bound = 1 / math.sqrt(fan_in)
      assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
      if w.size > 2000:  # uniform: std = bound / sqrt(3)
        assert abs(w.std() * math.sqrt(3) / bound - 1) < 0.05
      if getattr(node, "bias", None) is not None:
        b = np.asarray(leaves["bias"])
        assert np.abs(b).max() <= bound and (b.size < 4 or np.abs(b).max() > 0)
      seen += 1
  assert seen >= 4


def test_init_schemes_differ_and_he_lecun_is_the_stages_own():
  torch_p = get_model("small_cnn", (28, 28, 1), 10).init(jax.random.key(0))[0]
  he_p = get_model("small_cnn", (28, 28, 1), 10, init="he_lecun").init(jax.random.key(0))[0]
  conv = he_p[0]["conv"]["kernel"]
  # He-normal: std sqrt(2 / fan_in), zero biases
  assert abs(float(np.std(conv)) / math.sqrt(2 / 9) - 1) < 0.35
  assert float(np.abs(he_p[0]["conv"]["bias"]).max()) == 0
  assert float(np.abs(torch_p[0]["conv"]["bias"]).max()) > 0
  assert float(np.abs(torch_p[0]["conv"]["kernel"]).max()) <= 1 / 3


def test_he_fan_out_draws_conv_kernels_over_fan_out_and_the_rest_as_torch():
  """``init="he_fan_out"`` (the MultiSFL authors' ResNet-18): every
  convolution kernel normal with std sqrt(2 / (kh kw cout)), PyTorch's
  ``kaiming_normal_(mode="fan_out")``; every other parameter, convolution
  biases included, the very draw ``"torch"`` makes.  One jitted init each."""
  draws = {s: jax.device_get(jax.jit(get_model("small_cnn", (28, 28, 1), 10, init=s).init)(
      jax.random.key(0))[0]) for s in ("torch", "he_fan_out")}
  flat = {s: {jax.tree_util.keystr(k): np.asarray(v) for k, v in
              jax.tree_util.tree_flatten_with_path(p)[0]} for s, p in draws.items()}
  kernels = [k for k, v in flat["torch"].items() if "conv" in k and k.endswith("['kernel']")]
  assert len(kernels) == 2
  for k, v in flat["he_fan_out"].items():
    if k in kernels:
      assert not np.allclose(v, flat["torch"][k])
      if v.size > 2000:  # the second conv, 3x3x16x32: the std within 5%
        kh, kw, _, cout = v.shape
        assert abs(float(v.std()) / math.sqrt(2 / (kh * kw * cout)) - 1) < 0.05, k
        assert abs(float(v.mean())) < 0.05 * float(v.std())
        assert np.abs(v).max() > 1 / math.sqrt(math.prod(v.shape[:-1]))  # past torch's bound
    else:
      np.testing.assert_array_equal(v, flat["torch"][k])


def test_torch_init_refuses_a_parameter_without_a_rule():
  from flax import nnx

  from jsfl.models import inits

  class Odd(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jnp.ones(3))

  with pytest.raises(TypeError, match="no rule for parameter w"):
    inits.torch_init(Odd(), jax.random.key(0))
  with pytest.raises(ValueError, match="init='glorot'; allowed: torch, he_lecun, he_fan_out"):
    get_model("small_cnn", (28, 28, 1), 10, init="glorot")


# ------------------------------------------------- against PyTorch's model
def _torch_reference(name):
  from conftest import ROOT, load_script
  mod = load_script("experiments/hydra/authors_code/torch_reference.py")
  return mod, mod.read(ROOT / f"tests/data/{name}_torch.npz")


# DenseNet-161's 161 BatchNorms all differ in width, so XLA:CPU generates
# code for every one anew (ResNet-101's repeated blocks share theirs): its
# float64 training step took ~130 s of CPU to compile with XLA's convolutions
# at LLVM's default optimisation, ~45 s with im2col's matmuls at level 0.
# Neither changes what is computed (the lowering tests); its evaluation
# keeps the training lowering.  ResNet-101's step compiles in 15 s at level 0,
# 29 at the suite's 1.  A level that computed wrongly would fail these
# float64 comparisons, not pass them.
_PYTORCH_CHECK = {"densenet161": ({"conv_impl": "im2col", "depthwise_impl": "grouped",
                                   "eval_conv_impl": "same"},
                                  {"xla_backend_optimization_level": 0}),
                  "resnet101": (XLA, {"xla_backend_optimization_level": 0})}


# DenseNet-161's check compiles for a minute on two cores: the slow suite's.
@pytest.mark.parametrize("name,count", [("mobilenet_v1", 83), ("resnet18", 62),
                                        ("resnet101", 314),
                                        pytest.param("densenet161", 484,
                                                     marks=pytest.mark.slow)])
def test_models_compute_pytorchs_function(name, count):
  """jsfl's MobileNetV1 and ResNet-18 at their defaults are the PyTorch
  models the Hydra cross-check runs (experiments/hydra/authors_code/models/),
  and its ResNet-101 (Hydra's, on a CIFAR-sized batch) and DenseNet-161
  (MultiSFL's, on a TinyImageNet-sized one, 200 classes) the ports beside
  them, at full depth and 1/8 width:
  from the same float64 weights, a train-mode forward and backward and the
  running statistics it leaves, then an eval forward, agree with PyTorch's
  (``torch_reference.py`` wrote them) to float64 round-off; with XLA's SAME
  padding they do not (a stride-2 layer samples the input one pixel off),
  except DenseNet-161's, whose convolutions all have stride 1.
  XLA's lowerings compile fastest here; the CPU's own (im2col, shifts) equal
  them to float tolerance, TORCH padding included (the lowering tests)."""
  ref, want = _torch_reference(name)
  x, y = ref.batch(name)

  def flat(tree):
    return {"/".join(str(k.key) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

  options, compiler_options = _PYTORCH_CHECK.get(name, (XLA, {}))
  with jax.enable_x64(True):
    results = {}
    # DenseNet-161 is the same function under SAME (checked below)
    for padding in ("torch",) if name == "densenet161" else ("torch", "same"):
      m = get_model(name, ref.input_shape(name), ref.num_classes(name),
                    width=ref.MODELS[name], padding=padding, **options)
      abstract = jax.eval_shape(m.init, jax.random.key(0))
      params, stats = (tuple(jax.tree_util.tree_map_with_path(
          lambda p, a, i=i: np.asarray(ref.shared_value(
              "/".join([str(i)] + [str(k.key) for k in p]), a.shape)), t)
          for i, t in enumerate(tree)) for tree in abstract)
      params, stats = jax.tree.map(jnp.asarray, (params, stats))
      if padding == "same":  # its logits alone
        forward = jax.jit(lambda p, s, x, m=m: m.apply(p, s, x, train=True)[0])
        results[padding] = np.asarray(forward.lower(params, stats, jnp.asarray(x)).compile(
            compiler_options)(params, stats, jnp.asarray(x)))
        continue

      def loss(p, m=m, stats=stats):
        logits, new_stats = m.apply(p, stats, jnp.asarray(x), train=True)
        nll = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])
        return nll, (logits, new_stats)

      step = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(params).compile(
          compiler_options)
      (l, (logits, new_stats)), g = step(params)
      evaluated = jax.jit(m.logits).lower(params, new_stats, jnp.asarray(x)).compile(
          compiler_options)(params, new_stats, jnp.asarray(x))
      # numpy from here on: a jax op outside this context would be float32
      results[padding] = jax.tree.map(np.asarray, (l, logits, g, new_stats, evaluated))

  l, logits, g, new_stats, evaluated = results["torch"]
  assert logits.dtype == np.float64
  np.testing.assert_allclose(logits, want["logits_train"], rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(float(l), float(want["loss"]), rtol=1e-10)
  grads = {f"{i}/{k}": v for i, t in enumerate(g) for k, v in flat(t).items()}
  assert len(grads) == sum(k.startswith("grad_norm:") for k in want) == count
  for path, v in grads.items():
    np.testing.assert_allclose(np.linalg.norm(v), want[f"grad_norm:{path}"], rtol=1e-8)
    np.testing.assert_allclose(np.sum(v * ref.projection(path, v.shape)),
                               want[f"grad_dot:{path}"], rtol=1e-7, atol=1e-9)
  for i, t in enumerate(new_stats):
    for k, v in flat(t).items():  # the running variance moves unbiased
      np.testing.assert_allclose(np.sum(v * ref.projection(f"{i}/{k}", v.shape)),
                                 want[f"stat_dot:{i}/{k}"], rtol=1e-9, atol=1e-9)
  np.testing.assert_allclose(evaluated, want["logits_eval"], rtol=1e-8, atol=1e-8)
  if name != "densenet161":
    assert not np.allclose(results["same"], want["logits_train"], rtol=1e-3, atol=1e-3)
    return
  # Its convolutions all have stride 1 (its pools pad nothing), where SAME
  # and TORCH pad alike (test_torch_padding_is_kernel_half_on_every_side).
  convs = [n for n in _inference_nodes(m) if isinstance(n, layers.Conv)]
  assert len(convs) == 160 and {(n.stride, n.padding) for n in convs} == {(1, "TORCH")}
