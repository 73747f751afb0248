"""FedMut in its SFL form (docs/methods-multisfl.md#sfl-form-baselines): SFL whose participants
start each round from mutated copies of the global client portion.

FedMut: Hu, Cao, Li, Li, Liu, Li, Chen, Liu, "FedMut: Generalized Federated
Learning via Stochastic Mutation", AAAI 2024 (authors' code:
github.com/HMHelloWorld/FedMut).  After aggregation the global model ``w``
and its last update ``g = w_t - w_{t-1}`` give the next round's starting
models: for every layer (parameter leaf) independently, half of the
participants start at ``w + a g`` and the other half at
``w + a (-1 + beta_t) g``, in a random arrangement per layer, with a = 4 and
``beta_t = 0.3 (1 - min(t / 50, 1))`` (t the round that produced g);
with an odd number of participants one starts at ``w`` (the authors'
code).  The MultiSFL paper (Xia et al., AAAI 2025) runs FedMut as an SFL
baseline without details; in SFL only the client portions are aggregated
(the server portion is one model trained sequentially), so the mutation
applies to the client portions and the server portion is trained as in SFL.
The output model is the (unmutated) global model.

Decisions and departures:

* Only parameters are mutated; BatchNorm statistics start from the global
  ones (the authors mutate the whole state dict, running variances
  included, which can turn negative).
* With an odd number of participants the unmutated start is placed at a
  random position of the per-layer arrangement; the authors always leave the
  last sampled client unmutated.
* Aggregation is SFL's mean (``method.aggregation``, sample-weighted by
  default); the authors' code averages with equal weights
  (``Aggregation(w_locals, None)``), ``method.aggregation = "uniform"``.
* ``mutation_beta`` (beta_t of the starts used) and ``mutation_norm``
  (``||g||``) are logged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import Method, label_rank_of, split_communication, staged_model
from jsfl.core.plan import RoundPlan, plan_round
from jsfl.core.portion import fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import sfl_family, split
from jsfl.options import option, option_set

# A fixed fold-in constant keeps the mutation's randomness independent of the
# round plan drawn from the same round key.
_MUT_STREAM = 0x6D7574


# The radius is a length (0 = SFL); acc_rate > 1 would send the "opposite"
# half of the starts along +g too, so no mutation around w is left.  bound
# divides t, and >= 1 is its ``validate``'s bound.
@option_set
class FedMutOptions:
  radius: float = option(4.0, "mutation radius a (0 = no mutation)", range="[0, inf)",
                         batchable=True)
  acc_rate: float = option(0.3, "beta_0 of beta_t = beta_0 (1 - min(t / bound, 1))",
                           range="[0, 1]", batchable=True)
  bound: int = option(50, "rounds after which beta_t reaches 0", range="[1, 1000000]")


@struct.dataclass
class State:
  part1: tuple
  part1_stats: tuple
  part2: tuple
  part2_stats: tuple
  server_opt: object
  label_rank: jax.Array
  round: jax.Array
  prev_part1: tuple      # the global client portion one round earlier


def init(setup: Setup, key) -> State:
  validate(setup)
  s = sfl_family.init(setup, key)
  return State(s.part1, s.part1_stats, s.part2, s.part2_stats, s.server_opt,
               s.label_rank, s.round, s.part1)


def validate(setup: Setup) -> None:
  bound = setup.options.bound
  if bound < 1:
    raise ValueError(f"method.bound={bound!r}; allowed: an int >= 1")


def mutation_beta(o, t):
  """``beta_t = acc_rate (1 - min(t / bound, 1))`` (``o``: the round's options)."""
  rate, bound = o.acc_rate, float(o.bound)
  return rate * (1.0 - jnp.minimum(t.astype(jnp.float32) / bound, 1.0))


def mutation_signs(key, num_leaves: int, n: int, beta):
  """``(num_leaves, n)`` coefficients: per leaf a random arrangement of
  ``n // 2`` times 1, ``n // 2`` times ``-1 + beta`` and, for odd n, one 0."""
  h = n // 2
  base = jnp.concatenate([jnp.ones(h), jnp.full(h, -1.0 + beta),
                          jnp.zeros(n % 2)]).astype(jnp.float32)
  return jax.vmap(lambda i: jax.random.permutation(jax.random.fold_in(key, i), base))(
      jnp.arange(num_leaves))


def mutated_starts(setup: Setup, o, state: State, key):
  """The participants' ``(n, ...)`` starting client portions and beta_t.

  ``g = part1 - prev_part1`` is zero in the first round, so every start is
  then the global model.
  """
  n = setup.clients_per_round
  a = o.radius
  beta = mutation_beta(o, jnp.maximum(state.round - 1, 0))
  leaves, treedef = jax.tree.flatten(state.part1)
  prev = jax.tree.leaves(state.prev_part1)
  signs = mutation_signs(key, len(leaves), n, beta)
  out = [w[None] + a * signs[i].reshape((n,) + (1,) * w.ndim) * (w - p)[None]
         for i, (w, p) in enumerate(zip(leaves, prev, strict=True))]
  cast = [o.astype(w.dtype) for o, w in zip(out, leaves, strict=True)]
  return jax.tree.unflatten(treedef, cast), beta


def plan(setup: Setup, state: State, data, key) -> RoundPlan:
  """SFL's round plan with the round's mutation key as its context."""
  return plan_round(setup, data, key, state.round)._replace(
      context=jax.random.fold_in(key, _MUT_STREAM))


def mutated_part1(setup: Setup):
  def client_init(state: State, plan: RoundPlan):
    starts, _ = mutated_starts(setup, plan.options, state, plan.context)
    return fresh_stack(plan, starts, broadcast(state.part1_stats, setup.clients_per_round))
  return client_init


def finish(setup: Setup, state: State, out: split.SplitRound):
  """SFL's next state (remembering the start's part-1) and metrics plus
  ``mutation_beta`` and ``mutation_norm``."""
  new, metrics = sfl_family.finish(state, out, prev_part1=state.part1)
  # round 1 has no update to mutate along: every start is the global model
  metrics["mutation_beta"] = jnp.where(
      state.round > 0, mutation_beta(out.plan.options, jnp.maximum(state.round - 1, 0)), 0.0)
  metrics["mutation_norm"] = jnp.sqrt(sum(
      jnp.sum((w - p) ** 2) for w, p in zip(jax.tree.leaves(state.part1),
                                            jax.tree.leaves(state.prev_part1), strict=True)))
  return new, metrics


def build(setup: Setup) -> split.SplitRounds:
  """SFL-form FedMut for a run: SFL's round whose participants start from
  mutations of the global part-1 (method options ``radius``,
  ``acc_rate``, ``bound``)."""
  alg = sfl_family.algorithm(setup, client_init=mutated_part1(setup), plan=plan)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One SFL-form FedMut round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = staged_model


communication = split_communication


METHOD = Method(build, output_model, communication, validate=validate,
                label_rank=label_rank_of,
                options=FedMutOptions)
