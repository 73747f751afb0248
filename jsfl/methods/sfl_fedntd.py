"""FedNTD in its SFL form (docs/methods-multisfl.md#sfl-form-baselines): the SFL workflow whose
server loss is FedNTD's.

FedNTD: Lee et al., "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022.  The MultiSFL paper (Xia
et al., AAAI 2025, Sec. "Experimental Results") runs it, FedExp and FedMut
"in their SFL versions"; it publishes no details, so jsfl's SFL form is SFL
(``jsfl.methods.sfl``: client portions in parallel, ONE server portion
updated sequentially in the processing order, client portions averaged
under ``method.aggregation``) with FedNTD's loss at the server:
``CE + beta * tau^2 * KL(q~_global || q~_local)`` over the not-true classes
(:func:`jsfl.engine.ntd.ntd_loss`, shared with the parallel FedNTD).  The teacher is
the round's starting global model (client portion + server portion, frozen,
eval mode) on the same client batch; its logits are computed once per
schedule segment for the segment's participants (the same values as once per
batch step; more forwards of the teacher when segments outnumber steps).
The distillation gradient reaches the client portions through the
cut-layer gradient, like the cross-entropy's.

On the split engine this is SFL's round with one hook changed: the server
loss (:func:`ntd_loss_fn`).  ``sfl_fedexp`` changes the aggregation and
``sfl_fedmut`` the clients' start portions in the same way.

Decisions and departures:

* Which SFL: the paper says "SFL versions"; docs/methods-splitfed.md's SFL
  is SplitFedV2 (docs/methods-multisfl.md#sfl-form-baselines), which is
  what these three modules build on.  The MultiSFL paper's own SFL
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
* Defaults beta = 1, tau = 1, as ``fedntd``'s (docs/methods-sequential.md); the ``tau^2``
  factor of the authors' code is kept (see ``fedntd``).
"""

from __future__ import annotations

import jax.numpy as jnp

from jsfl.core.method import Method, activation_size, label_rank_of, split_communication
from jsfl.core.setup import Setup
from jsfl.engine import sfl_family, split
from jsfl.engine.ntd import FedNTDOptions, ntd_loss

State = sfl_family.State
init = sfl_family.init
output_model = sfl_family.output_model


def ntd_loss_fn(teacher_logits, beta: float, tau: float):
  """FedNTD's server loss on one client batch: ``CE + beta * NTD``, reported
  as the cross-entropy with ``beta * NTD`` as the extra term."""
  def loss(logits, y, mask):
    ce = split.cross_entropy(logits, y, mask)[0]
    r = beta * ntd_loss(logits, teacher_logits, y, mask, tau)
    return ce + r, ce, r
  return loss


def serve(setup: Setup) -> split.ServerRule:
  """The server rule: SFL's, with the teacher's logits of the segment's
  batches (computed once per segment for its participants) in the loss; the teacher
  is the round's starting model (part-1 + part-2 of the state)."""
  def rule(state, plan, step):
    o = plan.options
    teacher = (state.part1 + state.part2, state.part1_stats + state.part2_stats)
    n, b = step.idx.shape
    x = step.x.reshape((n * b,) + step.x.shape[2:])
    t_logits = setup.model.apply(*teacher, x, train=False)[0].reshape(n, b, -1)

    def one(srv, act, y, mask, k):
      part2, reg = srv
      part2, g_a, lsum, rsum = split.server_update(
          setup, plan.tx, part2, act, y, mask, ntd_loss_fn(t_logits[k], o.beta, o.tau))
      return (part2, reg + rsum), g_a, lsum
    return split.SequentialServer(one, setup.server_unroll)
  return rule


def server(state: State, plan):
  """SFL's server carry and the round's regulariser sum."""
  return sfl_family.server(state, plan), jnp.zeros((), jnp.float32)


def finish(setup: Setup, state: State, out: split.SplitRound):
  """SFL's next state and metrics plus ``reg_loss`` (mean ``beta * NTD``)."""
  part2, reg = out.server
  new, metrics = sfl_family.finish(state, out._replace(server=part2))
  metrics["reg_loss"] = reg / jnp.maximum(metrics["samples"], 1)
  return new, metrics


def build(setup: Setup) -> split.SplitRounds:
  """SFL-form FedNTD for a run (method options ``beta``, ``tau``)."""
  alg = split.SplitAlgorithm(server_init=server, server_rule=serve(setup),
                             schedule=split.label_cycle)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One SFL-form FedNTD round (:func:`build`)."""
  return build(setup).round(state, data, key)


def communication(setup: Setup, samples: int):
  """SFL's bytes plus the teacher's cut-layer activation of every sample (up)."""
  up, down = split_communication(setup, samples)
  return up + samples * activation_size(setup.model, setup.cut) * 4, down


METHOD = Method(build, output_model, communication, label_rank=label_rank_of,
                options=FedNTDOptions)
