"""FedNTD in its SFL form (docs/methods-sequential.md, last paragraph): the SFL workflow whose
server loss is FedNTD's.

FedNTD: Lee et al., "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022.  The MultiSFL paper (Xia
et al., AAAI 2025, Sec. "Experimental Results") runs it, FedExp and FedMut
"in their SFL versions"; it publishes no details, so jsfl's SFL form is SFL
(``jsfl.methods.sfl``: client portions in parallel, ONE server portion
updated sequentially in the processing order, client portions averaged
sample-weighted) with FedNTD's loss at the server:
``CE + beta * tau^2 * KL(q~_global || q~_local)`` over the not-true classes
(:func:`jsfl.methods.fedntd.ntd_loss`, reused unchanged).  The teacher is
the round's starting global model (client portion + server portion, frozen,
eval mode) on the same client batch; its logits are computed once per batch
step for all participants.  The distillation gradient reaches the client
portions through the cut-layer gradient, like the cross-entropy's.

On the split engine this is SFL's round with one hook changed: the server
loss (:func:`ntd_loss_fn`).  ``sfl_fedexp`` changes the aggregation and
``sfl_fedmut`` the clients' start portions in the same way.

Decisions and departures:

* Which SFL: docs/methods-sequential.md says "the SFL workflow", and
  docs/methods-splitfed.md's SFL is SplitFedV2,
  which is what these three modules build on.  The MultiSFL paper's own SFL
  baseline is the parallel one (its text: clients work with the main server
  "in parallel"; the authors' public code gives each selected client copies
  of both global portions and averages both), i.e. SplitFedV1, which equals
  FedAvg (tested).  Under that reading the SFL forms would equal the FL
  methods (``fedntd`` for FedNTD); ``experiments/multisfl`` reports both SFL
  rows.
* The teacher's cut-layer features are computed at the client with the
  frozen global client portion and uploaded next to the student's, so
  :func:`communication` counts one extra activation per sample up.
* Metrics: ``loss`` is the mean cross-entropy (as SFL's), ``reg_loss`` the
  mean ``beta * NTD`` term (as ``fedntd``'s).
* Defaults beta = 1, tau = 1 (docs/methods-sequential.md); the ``tau^2`` factor of the authors'
  code is kept (see ``fedntd``).
"""

from __future__ import annotations

import jax.numpy as jnp

from jsfl.core.data import round_options
from jsfl.core.method import Method, activation_size, label_rank_of, split_communication
from jsfl.core.setup import Setup
from jsfl.engine import split
from jsfl.methods import fedntd, sfl

State = sfl.State
init = sfl.init
output_model = sfl.output_model


def ntd_loss_fn(teacher_logits, beta: float, tau: float):
  """FedNTD's server loss on one client batch: ``CE + beta * NTD``, reported
  as the cross-entropy with ``beta * NTD`` as the extra term."""
  def loss(logits, y, mask):
    ce = split.cross_entropy(logits, y, mask)[0]
    r = beta * fedntd.ntd_loss(logits, teacher_logits, y, mask, tau)
    return ce + r, ce, r
  return loss


def serve(setup: Setup, teacher, beta: float, tau: float):
  """The server rule: SFL's, with the teacher's logits of the step's batches
  (computed once per step for all participants) in the loss."""
  def make(plan, step):
    n, b = step.idx.shape
    x = step.x.reshape((n * b,) + step.x.shape[2:])
    t_logits = setup.model.apply(*teacher, x, train=False)[0].reshape(n, b, -1)

    def one(srv, act, y, mask, k):
      part2, reg = srv
      part2, g_a, lsum, rsum = split.server_update(
          setup, plan.tx, part2, act, y, mask, ntd_loss_fn(t_logits[k], beta, tau))
      return (part2, reg + rsum), g_a, lsum
    return split.SequentialServer(one, setup.server_unroll)
  return make


def round(setup: Setup, state: State, data, key):
  """One SFL-form FedNTD round.

  Args:
    setup: static run description (method options ``beta``, ``tau``).
    state: SFL's state.
    data: device data.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``: SFL's metrics plus ``reg_loss`` (mean
    ``beta * NTD``).
  """
  o = round_options(setup, data)
  beta, tau = o.beta, o.tau
  teacher = (state.part1 + state.part2, state.part1_stats + state.part2_stats)
  start = sfl.server(state)
  alg = split.SplitAlgorithm(
      server_init=lambda plan: (start(plan), jnp.zeros((), jnp.float32)),
      server_rule=serve(setup, teacher, beta, tau))
  out = split.run_round(alg, setup, state, data, key, label_rank=state.label_rank)
  part2, reg = out.server
  new, metrics = sfl.finish(state, out._replace(server=part2))
  metrics["reg_loss"] = reg / jnp.maximum(metrics["samples"], 1)
  return new, metrics


def communication(setup: Setup, samples: int):
  """SFL's bytes plus the teacher's cut-layer activation of every sample (up)."""
  up, down = split_communication(setup, samples)
  return up + samples * activation_size(setup.model, setup.cut) * 4, down


METHOD = Method(init, round, output_model, communication, label_rank=label_rank_of,
                options=fedntd.FedNTDOptions)
