"""Models as sequences of stages, used functionally.

A model is an ordered list of NNX modules ("stages").  A cut index ``c`` splits
it into the client portion (part-1) ``[0, c)`` and the server portion
(part-2) ``[c, S)``; Hydra's second cut ``c_b`` splits part-2 into part-2a
``[c, c_b)`` and the heads ``[c_b, S)`` (docs/setting.md#model-splits).  Each model module
documents its stage numbering.

The modules are split once into graphdefs and state; training code only sees
pytrees:

* ``params``: a tuple with one pure dict of ``nnx.Param`` values per stage,
* ``stats``: a tuple with one pure dict of ``nnx.BatchStat`` values per stage
  (empty dicts where a stage has no BatchNorm).  Statistics travel with their
  portion and are aggregated like parameters.

A portion is simply ``params[a:b], stats[a:b]``; :meth:`StagedModel.apply`
runs any contiguous range of stages.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jsfl.models import inits, layers
from jsfl.models.shapes import InputTooSmall, check_input_size

__all__ = ["InputTooSmall", "StagedModel", "check_input_size", "count_params", "get_model",
           "model_factory", "model_names", "register"]

Params = tuple  # tuple[dict, ...], one per stage
Stats = tuple


@dataclasses.dataclass(frozen=True, eq=False)
class StagedModel:
  """A model split into stages with documented cut indices.

  Attributes:
    name: registry name.
    build: ``rngs -> list[nnx.Module]``; each module is called as
      ``stage(x, train=..., mask=...)``.
    input_shape: ``(H, W, C)`` of one sample.
    num_classes: output width.
    default_cut: part-1 / part-2 cut used when a config gives none.
    default_head_cut: Hydra's part-2a / heads cut used when none is given.
    stage_names: one short name per stage, for docs and error messages.
    head_cuts: named Hydra head cuts (e.g. MobileNetV1 "small" / "large").
    init_scheme: layer initialisation (:mod:`jsfl.models.inits`): ``"torch"``
      or ``"he_lecun"`` (the stages' own draws).
    eval_conv_impl: the dense-conv lowering of evaluation forwards
      (``apply(..., inference=True)``, :meth:`logits`):
      :func:`jsfl.models.layers.inference_conv_impl`'s ``choice``.  The
      same parameters, another program: evaluation needs no gradient, so it
      may take the lowering whose forward is fastest.
    padding: the convention of its SAME-padded layers
      (:data:`jsfl.models.layers.PADDING_MODES`): ``"torch"`` pads them
      ``kernel // 2`` on every side as the PyTorch models the papers ran
      (another function from XLA's SAME at stride 2 on an even size);
      ``"same"`` keeps XLA's SAME.  The parameters are the same either way.
    im2col_grad: the kernel-gradient form of its im2col convolutions
      (:data:`jsfl.models.layers.IM2COL_GRADS`); ``"auto"``: the backend's
      (:func:`jsfl.models.layers.default_im2col_grad`) when traced.
    im2col_narrow: the form of its im2col convolutions over one input
      channel (:data:`jsfl.models.layers.IM2COL_NARROWS`); ``"auto"``: the
      backend's (:func:`jsfl.models.layers.default_im2col_narrow`) when traced.
    precision: the compute type of training forwards and their backward
      (:data:`PRECISIONS`): ``"bfloat16"`` runs every stage's matmuls and
      activations in bfloat16 from float32 parameters (a copy cast per
      call), keeps BatchNorm's statistics and the returned logits in
      float32, and leaves parameters, statistics, optimiser state and loss
      float32; evaluation forwards stay float32.
  """

  name: str
  build: Callable[[nnx.Rngs], Sequence[nnx.Module]]
  input_shape: tuple[int, int, int]
  num_classes: int
  default_cut: int
  default_head_cut: int
  stage_names: tuple[str, ...]
  head_cuts: tuple = ()  # ((name, cut), ...): hashable presets
  init_scheme: str = "he_lecun"
  eval_conv_impl: str = "same"
  padding: str = "same"
  im2col_grad: str = "auto"
  im2col_narrow: str = "auto"
  precision: str = "float32"
  # Set once in __post_init__ (the dataclass is frozen): one graph definition
  # and one abstract (params, stats) pair per stage, and the graph
  # definitions of evaluation forwards.
  _graphdefs: tuple = dataclasses.field(init=False, repr=False, compare=False)
  _abstract: tuple = dataclasses.field(init=False, repr=False, compare=False)
  _inference_graphdefs: tuple = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if _FACTORY_DRAFT.get():
      return  # get_model replaces this draft: the replacement builds once
    stages = nnx.eval_shape(lambda: list(self.build(nnx.Rngs(0))))
    if self.padding == "torch":
      for s in stages:
        for _, node in nnx.iter_graph(s):
          if hasattr(node, "use_torch_padding"):
            node.use_torch_padding()
    forms = {k: v for k, v in (("grad", self.im2col_grad), ("narrow", self.im2col_narrow))
             if v != "auto"}
    if forms:
      for s in stages:
        for _, node in nnx.iter_graph(s):
          if hasattr(node, "use_im2col"):
            node.use_im2col(**forms)
    graphdefs, abstract = [], []
    for s in stages:
      g, p, b, rest = nnx.split(s, nnx.Param, nnx.BatchStat, ...)
      if jax.tree.leaves(rest):
        raise TypeError(f"stage {type(s).__name__} of {self.name} has state "
                        "other than Param/BatchStat; keep stages stateless")
      graphdefs.append(g)
      abstract.append((p, b))
    if len(graphdefs) != len(self.stage_names):
      raise ValueError(f"{self.name}: {len(graphdefs)} stages but "
                       f"{len(self.stage_names)} stage names")
    object.__setattr__(self, "_graphdefs", tuple(graphdefs))
    object.__setattr__(self, "_abstract", tuple(abstract))
    object.__setattr__(self, "_inference_graphdefs", self._for_inference(stages))

  def _for_inference(self, stages) -> tuple:
    """The evaluation graph definitions: the same abstract stages, their
    convolutions switched to ``eval_conv_impl`` (the training ones are
    already split off)."""
    if self.eval_conv_impl == "same":
      return self._graphdefs
    for s in stages:
      for _, node in nnx.iter_graph(s):
        if hasattr(node, "for_inference"):
          node.for_inference(self.eval_conv_impl)
    return tuple(nnx.split(s, nnx.Param, nnx.BatchStat, ...)[0] for s in stages)

  def shapes(self) -> tuple[Params, Stats]:
    """What :meth:`init` returns, as ``jax.ShapeDtypeStruct`` leaves, read
    off the stages built once at construction: tracing ``init`` for its
    shapes takes seconds on the deep models (every initialiser's draw)."""
    def struct(part):
      return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          nnx.to_pure_dict(part))
    return (tuple(struct(p) for p, _ in self._abstract),
            tuple(struct(b) for _, b in self._abstract))

  @property
  def num_stages(self) -> int:
    return len(self._graphdefs)

  def check_cut(self, cut: int, name: str = "cut", low: int = 1) -> int:
    """Validates a cut index; raises a ValueError naming the allowed range."""
    ok = isinstance(cut, (int, np.integer)) and not isinstance(cut, (bool, np.bool_))
    if not ok or not low <= cut <= self.num_stages - 1:
      raise ValueError(
          f"{name}={cut!r} for model {self.name!r}; allowed: an int in "
          f"[{low}, {self.num_stages - 1}] (stages: "
          + ", ".join(f"{i}={n}" for i, n in enumerate(self.stage_names)) + ")")
    return int(cut)

  def init(self, key: jax.Array) -> tuple[Params, Stats]:
    """Fresh ``(params, stats)``; traceable, so it can be vmapped over seeds."""
    k_build, k_init = jax.random.split(key)
    stages = self.build(nnx.Rngs(params=k_build))
    inits.apply(self.init_scheme, stages, k_init)
    params, stats = [], []
    for s in stages:
      parts: Any = nnx.split(s, nnx.Param, nnx.BatchStat, ...)
      p, b = parts[1], parts[2]
      params.append(nnx.to_pure_dict(p))
      stats.append(nnx.to_pure_dict(b))
    return tuple(params), tuple(stats)

  def apply(self, params: Params, stats: Stats, x: jax.Array, *,
            start: int = 0, train: bool, mask: jax.Array | None = None,
            inference: bool = False) -> tuple[jax.Array, Stats]:
    """Runs stages ``[start, start + len(params))``.

    Args:
      params: per-stage parameter dicts of the range.
      stats: per-stage BatchNorm statistics of the range.
      x: the input batch of stage ``start``.
      start: index of the first stage.
      train: batch statistics (and their update) when True, running ones else.
      mask: ``(B,)`` bool, valid samples (padding is left out of BN stats).
      inference: an evaluation forward (requires ``train=False``): the
        layers' ``eval_conv_impl`` lowerings, for outputs no gradient is
        taken through (slower to differentiate on some backends).

    Returns:
      ``(output, new_stats)``; ``new_stats`` equals ``stats`` when not
      training.
    """
    if inference and train:
      raise ValueError("apply: inference=True needs train=False")
    graphdefs = self._inference_graphdefs if inference else self._graphdefs
    low = train and self.precision != "float32"
    if low:
      x = _cast(x, self.precision)
    new_stats = []
    for i, (p, b) in enumerate(zip(params, stats, strict=True)):
      g = graphdefs[start + i]
      module = nnx.merge(g, _cast(p, self.precision) if low else p, b)
      x = module(x, train=train, mask=mask)
      if train and jax.tree.leaves(b):
        _, nb = nnx.split(module, nnx.BatchStat, ...)[:2]
        # statistics keep their own type whatever the compute type
        new_stats.append(jax.tree.map(lambda n, o: n.astype(o.dtype),
                                      nnx.to_pure_dict(nb), b))
      else:
        new_stats.append(b)
    if low and start + len(params) == self.num_stages:  # logits, for a float32 loss
      x = x.astype(jnp.float32)
    return x, tuple(new_stats)

  def logits(self, params: Params, stats: Stats, x: jax.Array) -> jax.Array:
    """Eval-mode forward of the whole model, in its evaluation lowerings."""
    return self.apply(params, stats, x, train=False, inference=True)[0]


PRECISIONS = ("float32", "bfloat16")


def _cast(tree, precision: str):
  """The floating leaves of ``tree`` in ``precision`` (integers, masks and
  keys unchanged)."""
  dtype = jnp.dtype(precision)
  return jax.tree.map(lambda a: a.astype(dtype)
                      if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, tree)


_REGISTRY: dict[str, Callable[..., StagedModel]] = {}


def register(name: str):
  """Registers ``factory(input_shape, num_classes, **options) -> StagedModel``.

  The factory returns the model it constructs without reading its stages
  (``num_stages``, ``init``, ...): under :func:`get_model` that model is a
  draft whose stages are built once, in the copy ``get_model`` returns."""
  def deco(fn):
    _REGISTRY[name] = fn
    return fn
  return deco


def model_names() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def model_factory(name: str) -> Callable[..., StagedModel]:
  """The registered ``factory(input_shape, num_classes, **options)`` (KeyError
  for an unknown name): its signature lists the model's options."""
  return _REGISTRY[name]


def get_model(name: str, input_shape, num_classes: int, *, init: str = "torch",
              eval_conv_impl: str = "auto", padding: str = "torch",
              precision: str = "float32", im2col_grad: str = "auto",
              im2col_narrow: str = "auto", **options: Any) -> StagedModel:
  """Builds a registered model initialised by ``init``
  (:data:`jsfl.models.inits.INITS`), evaluated in ``eval_conv_impl``
  (:func:`jsfl.models.layers.inference_conv_impl`), its SAME layers padded
  by the ``padding`` convention (:attr:`StagedModel.padding`), trained in
  ``precision`` (:attr:`StagedModel.precision`), its im2col convolutions
  formed as ``im2col_grad`` and ``im2col_narrow`` say
  (:attr:`StagedModel.im2col_grad`); unknown names give a clear
  ValueError, as does an input too small for it."""
  if name not in _REGISTRY:
    raise ValueError(f"model={name!r}; allowed: {', '.join(model_names())}")
  if init not in inits.INITS:
    raise ValueError(f"init={init!r}; allowed: {', '.join(inits.INITS)}")
  if eval_conv_impl not in layers.EVAL_CONV_IMPLS:
    raise ValueError(f"eval_conv_impl={eval_conv_impl!r}; allowed: "
                     f"{', '.join(layers.EVAL_CONV_IMPLS)}")
  if padding not in layers.PADDING_MODES:
    raise ValueError(f"padding={padding!r}; allowed: {', '.join(layers.PADDING_MODES)}")
  if precision not in PRECISIONS:
    raise ValueError(f"precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
  for key, value, allowed in (("im2col_grad", im2col_grad, layers.IM2COL_GRADS),
                              ("im2col_narrow", im2col_narrow, layers.IM2COL_NARROWS)):
    if value not in ("auto",) + allowed:
      raise ValueError(f"{key}={value!r}; allowed: {', '.join(('auto',) + allowed)}")
  try:
    return _cached(name, tuple(input_shape), int(num_classes),
                   tuple(sorted(options.items())), init, eval_conv_impl, padding,
                   precision, im2col_grad, im2col_narrow)
  except InputTooSmall as e:
    # The net for models without their own check_input_size.
    raise ValueError(f"{name}: input_shape={tuple(input_shape)!r} is too small "
                     f"({e}); allowed: larger H and W") from None


_CACHE: dict = {}
# Set while get_model calls a factory whose result it replaces at once:
# tracing the stages (seconds for ResNet-101 or DenseNet-161) happens only
# for the replacement.
_FACTORY_DRAFT = contextvars.ContextVar("jsfl_model_factory_draft", default=False)


@contextlib.contextmanager
def _drafting(draft: bool):
  """``_FACTORY_DRAFT`` at ``draft`` inside: a factory that builds another
  model through get_model still gets that model built."""
  token = _FACTORY_DRAFT.set(draft)
  try:
    yield
  finally:
    _FACTORY_DRAFT.reset(token)


def _cached(name, input_shape, num_classes, options, init, eval_conv_impl, padding,
            precision, im2col_grad, im2col_narrow):
  key = (name, input_shape, num_classes, options, init, eval_conv_impl, padding, precision,
         im2col_grad, im2col_narrow)
  if key not in _CACHE:
    with _drafting(True):
      model = _REGISTRY[name](input_shape, num_classes, **dict(options))
    with _drafting(False):
      _CACHE[key] = dataclasses.replace(model, init_scheme=init,
                                        eval_conv_impl=eval_conv_impl, padding=padding,
                                        precision=precision, im2col_grad=im2col_grad,
                                        im2col_narrow=im2col_narrow)
  return _CACHE[key]


def count_params(tree) -> int:
  return int(sum(jnp.size(a) for a in jax.tree.leaves(tree)))
