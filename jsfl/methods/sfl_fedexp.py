"""FedExp in its SFL form (docs/methods-multisfl.md#sfl-form-baselines): SFL whose
client-portion aggregation is FedExp's extrapolating server step.

FedExp: Jhunjhunwala, Wang, Joshi, "FedExP: Speeding Up Federated Averaging
via Extrapolation", ICLR 2023.  The MultiSFL paper (Xia et al., AAAI 2025)
runs it as an SFL baseline without details.  In SFL only the client portions
are aggregated (the server portion is one model trained sequentially), so
FedExp's step replaces that aggregation at round end (``finish``; the
server rule is SFL's): with the round's global client
portion ``w`` and the participants' trained ones ``w_i``,
``D_i = w - w_i``, ``D_bar = sum_i a_i D_i``,
``eta_g = max(1, sum_i a_i ||D_i||^2 / (2 (||D_bar||^2 + eps)))`` and
``w <- w - eta_g D_bar``, norms over all client-portion parameters.  With the
default uniform weights ``a_i = 1/M`` this is the FedExp paper's
``sum_i ||D_i||^2 / (2 M (||D_bar||^2 + eps))``; ``weights = "samples"``
uses SFL's sample weights instead (eta_g = 1 is then exactly SFL), which is
also what the FedExp authors' code does (``main.py`` weights both ``D_bar``
and the mean of ``||D_i||^2`` by the participants' normalised sample
counts).  The server portion is trained as in SFL.

Decisions and departures:

* BatchNorm statistics are not extrapolated (a variance could turn
  negative): they are averaged with the same weights ``a_i``.
* eps = 1e-3 (the FedExp paper's value for its vision experiments), as the
  paper writes it (``eps_form = "paper"``).  The FedExp authors' code
  (Divyansh03/FedExP, ``main.py``) adds ``M eps_t`` instead of ``eps``, M
  the round's participants and ``eps_t`` decayed with the square of its
  local learning rate (both by 0.998 a round): ``eps_form = "authors"``
  uses ``M eps (lr_t / lr)^2``, ``lr_t`` the round's learning rate under
  ``optim.lr_decay`` and ``lr`` the configured one.
* The FedExp paper and code evaluate the mean of the last two global
  iterates (training goes on from the last), which damps the oscillation
  extrapolation causes: ``evaluate = "last_two"`` outputs part-1 as that
  mean (their first round: the iterate itself), part-2 and the statistics
  as they stand (their code averages the parameter vector only); the
  default ``"last"`` outputs the last one, like every other method.
* ``eta_g`` is logged in the metrics.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.data import hyper
from jsfl.core.method import Method, label_rank_of, split_communication, staged_model
from jsfl.core.plan import RoundPlan
from jsfl.core.setup import Setup
from jsfl.core.trees import weighted_mean
from jsfl.engine import sfl_family, split
from jsfl.options import option, option_set

FEDEXP_WEIGHTS = ("uniform", "samples")
EPS_FORMS = ("paper", "authors")
EVALUATES = ("last", "last_two")


@struct.dataclass
class State(sfl_family.State):
  prev_part1: tuple = ()  # the global part-1 a round earlier (evaluate = "last_two")


def init(setup: Setup, key) -> State:
  base = sfl_family.init(setup, key)
  return State(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
               prev_part1=base.part1)


def output_model(setup: Setup, state: State):
  """SFL's model; under ``evaluate = "last_two"`` with part-1 the mean of
  the last two global ones once there are two."""
  params, stats = staged_model(setup, state)
  if setup.options.evaluate == "last_two":
    two = state.round >= 2
    part1 = jax.tree.map(lambda a, b: jnp.where(two, (a + b) / 2, a),
                         state.part1, state.prev_part1)
    params = part1 + state.part2
  return params, stats


# eps > 0 keeps eta_g finite when every client returns the global model
# (D_bar = 0); the bound is its ``validate``'s.
@option_set
class FedExpOptions:
  eps: float = option(1e-3, "FedExp's eps in the step-size denominator", range="(0, inf)",
                      batchable=True)
  weights: str = option("uniform", "client weights a_i: uniform 1/M (the FedExp paper's) "
                        "or by sample count (SFL's and the FedExp code's)",
                        choices=FEDEXP_WEIGHTS)
  eps_form: str = option("paper", "the denominator's eps: paper = eps; authors = the "
                         "FedExp code's M eps (lr_t / lr)^2, M participants, lr_t the "
                         "round's decayed learning rate", choices=EPS_FORMS)
  evaluate: str = option("last", "the model evaluated and output: last = the last "
                         "global model; last_two = part-1 the mean of the last two "
                         "(the FedExp paper's and code's evaluation)", choices=EVALUATES)


def validate(setup: Setup) -> None:
  eps = setup.options.eps
  if not eps > 0:
    raise ValueError(f"method.eps={eps!r}; allowed: a float > 0")


def _sq_norms(stacked):
  """``(M,)`` squared norms of every client's slice of a stacked pytree."""
  return sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1)
             for a in jax.tree.leaves(stacked))


def fedexp_step(global_params, stacked_params, weights, eps: float):
  """FedExp's server step on a stacked pytree of client results.

  Args:
    global_params: the round's starting global parameters.
    stacked_params: ``(M, ...)`` the clients' trained parameters.
    weights: ``(M,)`` non-negative client weights (normalised here).
    eps: the denominator's eps.

  Returns:
    ``(new global parameters, eta_g)``.
  """
  a = weights.astype(jnp.float32)
  a = a / jnp.sum(a)
  delta = jax.tree.map(lambda g, s: g[None] - s, global_params, stacked_params)
  mean = jax.tree.map(lambda d: jnp.tensordot(a, d, axes=1), delta)
  num = jnp.sum(a * _sq_norms(delta))
  den = 2.0 * (sum(jnp.sum(m ** 2) for m in jax.tree.leaves(mean)) + eps)
  eta = jnp.maximum(1.0, num / den)
  new = jax.tree.map(lambda g, m: (g - eta * m).astype(g.dtype), global_params, mean)
  return new, eta


def round_eps(setup: Setup, plan: RoundPlan):
  """The round's eps by ``eps_form``: ``eps``, or the FedExp code's
  ``M eps (lr_t / lr)^2`` (``plan.context``: the configured lr)."""
  eps = plan.options.eps
  if setup.options.eps_form == "paper":
    return eps
  return eps * plan.sizes.shape[0] * (plan.lr / plan.context) ** 2


def plan(setup: Setup, state: State, data, key) -> RoundPlan:
  """SFL's plan with the configured (undecayed) lr as its context."""
  return split.plan_at_round(setup, state, data, key)._replace(
      context=hyper(setup, data).lr)


def finish(setup: Setup, state: State, out: split.SplitRound):
  """FedExp's server step on the participants' part-1 (their statistics
  averaged with the same weights); SFL's metrics plus ``eta_g``."""
  o = out.plan.options
  w = out.plan.sizes if o.weights == "samples" else jnp.ones_like(out.plan.sizes)
  part1, eta = fedexp_step(state.part1, out.clients.params, w, round_eps(setup, out.plan))
  new, metrics = sfl_family.finish(state, out._replace(
      part1=part1, part1_stats=weighted_mean(out.clients.stats, w)), prev_part1=state.part1)
  metrics["eta_g"] = eta
  return new, metrics


def build(setup: Setup) -> split.SplitRounds:
  """SFL-form FedExp for a run: SFL's round with the part-1 copies kept
  apart and FedExp's extrapolated step at the end (method options
  ``eps``, ``weights``, ``eps_form``)."""
  return split.SplitRounds(setup, sfl_family.algorithm(setup, client_final=None, plan=plan),
                          init, finish)


def round(setup: Setup, state: State, data, key):
  """One SFL-form FedExp round (:func:`build`)."""
  return build(setup).round(state, data, key)


communication = split_communication


METHOD = Method(build, output_model, communication, validate=validate,
                label_rank=label_rank_of,
                options=FedExpOptions)
