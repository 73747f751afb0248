"""SFL = SplitFedV2: Thapa et al., "SplitFed: When Federated Learning Meets
Split Learning", AAAI 2022; the sequential-server form studied by Hydra
("Data Heterogeneity and Forgotten Labels in Split Federated Learning",
AAAI 2026, Sec. 2 and Algorithm 1); docs/methods-splitfed.md.

Each participating client holds a copy of part-1; ONE server part-2 is updated
sequentially: the split round (``jsfl.engine.split``) with the
:class:`~jsfl.engine.split.SequentialServer` rule over the round's serving
order, one SGD step per client batch: the processing order (random /
cyclic / cyclic_reverse / fixed) meets the batches as the Hydra authors'
server queue does (``method.order_rule = "authors"``, the default) or one
batch step at a time (``"steps"``; :mod:`jsfl.engine.schedule`).  What the
other SFL-family methods (the SFL forms of FedNTD, FedExp and FedMut,
SplitNN, MergeSFL, label smoothing) share with it is in
:mod:`jsfl.engine.sfl_family`.

At round end the part-1 copies (and their BatchNorm statistics) are averaged
sample-weighted, or uniformly under ``method.aggregation = "uniform"`` (the
Hydra authors' scripts).  Clients without a batch at a step are masked out of the
scan (the server skips them) and their part-1 is left unchanged; partial
participation samples ``clients_per_round`` of ``K`` clients per round.

Departure from the PyTorch reference: none in the math.  The server optimiser
state (momentum) persists across rounds, the clients' is rebuilt every round
(docs/setting.md#optimisation).
"""

from __future__ import annotations

from jsfl.core.method import Method, label_rank_of, split_communication
from jsfl.core.setup import Setup
from jsfl.engine import sfl_family
from jsfl.engine.sfl_family import State, finish, init, output_model

__all__ = ["METHOD", "State", "build", "finish", "init", "output_model", "round"]


def build(setup: Setup):
  """SFL for a run: :func:`jsfl.engine.sfl_family.algorithm` with the
  cross-entropy server loss."""
  return sfl_family.rounds(setup, sfl_family.algorithm(setup))


def round(setup: Setup, state: State, data, key):
  """One SFL round.

  Args:
    setup: static run description (``setup.order`` picks the processing order).
    state: see :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics: ``loss``, ``samples``, ``clients``
    (participants in the serving order of the round's first segment).
  """
  return build(setup).round(state, data, key)


communication = split_communication


METHOD = Method(build, output_model, communication, label_rank=label_rank_of)
