"""MultiSFL = KoReA-SFL: multi-model split federated learning with knowledge
replay.

Papers: Xia, Hu, Yan, Liu, Li, Xie, Chen, "MultiSFL: Towards Accurate Split
Federated Learning via Multi-Model Aggregation and Knowledge Replay", AAAI
2025 (Algorithm 1, Eqs. 2-6), and its longer version "KoReA-SFL: Knowledge
Replay-based Split Federated Learning Against Catastrophic Forgetting"
(ablation Conf1 / Conf2, Table 2).  docs/methods-multisfl.md is jsfl's
definition: where the papers are ambiguous, where the authors' code
(github.com/CodeFree-xzk/MultiSFL, the default behaviour) differs, and the
decisions neither settles.

n branches, each a client portion ``wc_i`` (fed server) and a server portion
``ws_i`` (main server), are stacked pytrees with a leading branch axis.  One
round is one jitted program:

1. n main clients are sampled without replacement and assigned to the
   branches in random order (:func:`~jsfl.methods.multisfl.algorithm.decide`).
2. Score vectors take the main clients' label counts; quotas follow from
   them and the round's sampling proportion ``p_r``
   (:mod:`~jsfl.methods.multisfl.replay`).  By default as the authors'
   code computes them (``score_update``, ``min_request``,
   ``request_rounding``); the papers' Eq. 2 and Eqs. 3-4 are the options'
   other values (``PAPER_READING``).
3. Knowledge extraction: per branch, the clients that may assist are visited
   in a random order, each giving ``min(outstanding quota, its holdings)`` of
   every class, sampled uniformly from its data of that class: a cumulative
   sum over a per-class holdings matrix and a gather from a per-class sample
   pool, into a fixed-size replay list with a validity mask.
4. Local training: E epochs of split SGD of every branch on its main
   client's batches, all branches side by side: the split round of
   :mod:`jsfl.engine.split` with a server portion per branch
   (:func:`~jsfl.methods.multisfl.algorithm.serve`); a step's server
   portion sees the main client's features and its replay share, whose
   features a copy of ``wc_i`` computes: by default in two forwards, each
   with its own BatchNorm batch, their losses summed (``server_forward =
   "separate"``, the authors' code), or as one concatenated batch
   (``"concat"``); only the main features send a gradient back.
5. The next sampling proportion from a gradient signal
   (:mod:`~jsfl.methods.multisfl.proportion`, option ``p_rule``).
6. Aggregation: master ``w = mean_i w_i`` (parameters and BatchNorm
   statistics, both portions), pull-back ``w_i <- (w_i + alpha w) / (1 +
   alpha)``.  The branch mean after the pull-back is the master again, so
   :func:`~jsfl.methods.multisfl.algorithm.output_model` returns it and the state
   keeps no separate copy.

Ablations (KoReA-SFL Table 2): ``replay = "off"`` is Conf1 (no knowledge
replay), ``"fixed"`` Conf2 (the constant proportion ``p0``), ``"adaptive"``
(default) MultiSFL.  :data:`PAPER_READING` holds the options that give the
paper's reading where the authors' code differs.

Modules: :mod:`~jsfl.methods.multisfl.options` (the option set),
:mod:`~jsfl.methods.multisfl.replay` (Eqs. 2-4 and knowledge extraction),
:mod:`~jsfl.methods.multisfl.proportion` (Eqs. 5-6 and the authors' rules),
:mod:`~jsfl.methods.multisfl.algorithm` (the round and ``METHOD``).
"""

from jsfl.methods.multisfl.algorithm import (
  METHOD,
  Decisions,
  State,
  authors_round_bytes,
  communication,
  decide,
  init,
  output_model,
  round,
  round_bytes,
  serve,
)
from jsfl.methods.multisfl.options import (
  PAPER_READING,
  MultiSFLOptions,
  options,
  proportion_cap,
  replay_sizes,
  validate,
)
from jsfl.methods.multisfl.proportion import (
  clp_proportion,
  fgn,
  next_proportion,
  push_signal,
  relative_proportion,
  signal,
  windowed_change,
)
from jsfl.methods.multisfl.replay import (
  assistant_takes,
  authors_shares,
  class_pool,
  client_holdings,
  priorities,
  quotas,
  replay_slots,
  step_shares,
  update_scores,
  update_scores_authors,
)

__all__ = [
  "METHOD", "PAPER_READING", "Decisions", "MultiSFLOptions", "State", "assistant_takes",
  "authors_round_bytes", "authors_shares", "class_pool", "client_holdings",
  "clp_proportion", "communication", "decide", "fgn", "init", "next_proportion",
  "options", "output_model", "priorities", "proportion_cap", "push_signal", "quotas",
  "relative_proportion", "replay_slots", "replay_sizes", "round", "round_bytes", "serve",
  "signal", "step_shares", "update_scores", "update_scores_authors", "validate",
  "windowed_change",
]
