"""MultiSFL = KoReA-SFL: multi-model split federated learning with knowledge
replay.

Papers: Xia, Hu, Yan, Liu, Li, Xie, Chen, "MultiSFL: Towards Accurate Split
Federated Learning via Multi-Model Aggregation and Knowledge Replay", AAAI
2025 (Algorithm 1, Eqs. 2-6), and its longer version "KoReA-SFL: Knowledge
Replay-based Split Federated Learning Against Catastrophic Forgetting"
(ablation Conf1 / Conf2, Table 2).  SPEC 4 resolves their ambiguities.

n branches, each a client portion ``wc_i`` (fed server) and a server portion
``ws_i`` (main server), are stored as stacked pytrees with a leading branch
axis.  One round (one jitted program, no host round trip):

1. n main clients are sampled without replacement and assigned to the
   branches in random order (branch i trains with main client ``clients[i]``).
2. Score vectors (Eq. 2) are updated with the main clients' label counts;
   quotas (Eqs. 3-4) follow from them and this round's sampling proportion
   ``p_r``.
3. Knowledge extraction (:func:`assistant_takes`, :func:`replay_slots`): per
   branch, the clients NOT in this round's main set are visited in a random
   order; each contributes ``min(outstanding quota, its holdings)`` of every
   class, sampled uniformly from its data of that class, until the quota is
   met or no inactive client has more.  It is a cumulative sum over a random
   client order of a per-class holdings matrix and a gather from a per-class
   sample pool (one sort of the index table per round), into a fixed-size
   replay list (``replay_sizes``) with a validity mask.
4. Local training: E epochs of split SGD of every branch on its main client's
   batches, all branches in one program: the split round of
   ``jsfl.engine.split`` with the branches' client portions as its
   participants and :func:`serve` as its server rule (every branch's server
   portion on its own main client's features plus replay, side by side over
   the branch axis, ``setup.client_exec``).  The replay list is spread evenly over the
   main client's batches of an epoch (:func:`step_shares`); the server batch
   of a step is the main client's features plus that step's replay share,
   computed by the frozen round-start copy of ``wc_i``; the loss is the
   cross-entropy over the concatenation; only the main client's features
   send a gradient back to ``wc_i``.
5. The next sampling proportion from a gradient signal (``p_rule``): by
   default the authors' critical-learning-period rule (their ``--DB 1``) on
   their signal, ``lr`` times the mean over epochs of the summed per-step
   ``2|g_c|^2 + |g_s|^2`` (:func:`signal`, :func:`windowed_change`,
   :func:`clp_proportion`); ``relative`` is their ``--DB 2``; ``spec`` is
   SPEC 4.6 on FGN (Eq. 5), ``clip(p_r (1 + (FGN(r) - FGN(r-1)) /
   |FGN(r-1)|), p_min, p_max)``.
6. Aggregation: master ``w = mean_i w_i`` (parameters and BatchNorm
   statistics, both portions), pull-back ``w_i <- (w_i + alpha w) / (1 + alpha)``.
   The mean of the pulled-back branches is the master again, so
   :func:`output_model` returns the branch mean (the master) and the state
   keeps no separate copy.

Ablations (KoReA-SFL Table 2): ``replay = "off"`` is Conf1 (no knowledge
replay), ``replay = "fixed"`` is Conf2 (replay with the constant proportion
``p0``), ``replay = "adaptive"`` (default) is MultiSFL.

The authors' code (github.com/CodeFree-xzk/MultiSFL) is the reference for
behaviour: the proportion rule and its signal, the score recursion
(``score_update``), the request floor ``L`` (``min_request = -1``) and its
rounding (``request_rounding``) follow it by default, SPEC 4's reading being
:data:`SPEC_READING`; ``docs/methods-multisfl.md`` tabulates every
difference.  The remaining decisions (where SPEC 4 is silent or jsfl does
not yet follow the authors):

* All branches start from the same initial model (the authors deep-copy one
  model into every branch).
* Replay features come from a copy of the branch's ``wc_i`` in training
  mode: BatchNorm normalises a replay share with its own batch statistics, as
  the authors' ``helper_net`` does; the copy's statistics updates are
  discarded.  By default (``replay_model = "epoch"``, the authors' code) the
  copy is taken at the start of every local epoch; ``"round"`` freezes the
  round-start copy (the model the fed server dispatches to assistants,
  Algorithm 1 line 13), so with E > 1 the same replay features are replayed
  every epoch.  The replay samples and their shares of the batches are the
  same every epoch either way.
* By default (``server_forward = "separate"``, the authors' code) the server
  portion runs on the main features and on the replay share separately (two
  BatchNorm batches, statistics updated by both) and the loss is the
  cross-entropy over the concatenated logits; ``"concat"`` runs ONE forward
  over the concatenated batch, as SPEC 4.2 words it.
* By default (``replay_schedule = "authors"``) main batch b of an epoch gets
  the b-th helper batch of ``h = ceil(Q / nb)`` of a fresh shuffle of the
  replay list, as the authors' loader gives it (:func:`authors_shares`);
  ``"even"`` gives batch b slots ``[floor(b Q / nb), floor((b+1) Q / nb))``
  of one shuffle, the same every epoch, so every sample is replayed once an
  epoch.
* An assistant is drawn at most once per branch and round (random order
  without replacement); different branches draw independently and may share
  assistants.  By default (``assistants = "not_self"``, the authors' code)
  every client but the branch's own main client may assist, the other main
  clients included; ``"inactive"`` keeps to the clients not training this
  round (the paper, SPEC 4.4).
* ``p_max`` caps every rule: it sizes the static replay buffer (the
  authors' ``--DB 1`` has no cap above 0.2 but +0.01 a round).
* With ``p_rule = "spec"``: ``p_1 = p_0`` (FGN(-1) does not exist), and p is
  kept when ``FGN(r-1) = 0`` or the update is not finite.  ``eta`` in FGN is the round's learning rate;
  ``g_i`` is the loss gradient (without weight decay) w.r.t. ``ws_i``.
* Master aggregation is uniform over branches (SPEC 4.7, the authors' code).
* Both portions' optimiser states are rebuilt every round, as the authors'
  code does (``server_opt = "reset"``); ``"keep"`` keeps each branch's server
  momentum across rounds (SPEC 1.3).
* ``loss`` in the metrics is the mean server loss over main and replay
  samples; ``samples`` counts main-client samples only (``replay_samples``
  the replayed ones).

Logged decisions (metrics): ``clients`` (the main client of branch i at
position i), ``p`` (p_r used), ``p_next``, ``fgn``, ``grad_signal`` (the
round's signal the proportion rule compares), ``replay_requested`` and
``replay_served`` ``(n, L)`` per branch and class (one epoch's replay list),
``assistants`` ``(n,)``, ``replay_samples``, and ``bytes_up`` / ``bytes_down``
of the round including replay features and labels (up), the model dispatch
and per-class request to every assistant (down).  ``communication`` gives the
replay-free part only (it sees no replay counts); the runner should prefer
the metrics' bytes when present.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core import batching
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import (
  LABEL_BYTES,
  Method,
  activation_size,
  portion_bytes,
  split_communication,
)
from jsfl.core.optim import gate, make_optimizer, with_lr
from jsfl.core.plan import RoundPlan, plan_round
from jsfl.core.portion import Portion, fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import split
from jsfl.methods.registry import REPLAY_MODES, MultiSFLOptions

# The options that give SPEC 4's reading where the authors' code differs
# (the experiments README reproduces the earlier SPEC-default results with it).
SPEC_READING = {"p_rule": "spec", "score_update": "eq2", "min_request": 0,
                "request_rounding": "spec", "assistants": "inactive", "server_opt": "keep",
                "replay_model": "round", "server_forward": "concat",
                "replay_schedule": "even"}


def options(setup: Setup) -> MultiSFLOptions:
  """The run's option set, ``min_request = -1`` resolved to the number of
  classes."""
  o = MultiSFLOptions.of(setup)
  return dataclasses.replace(o, min_request=setup.num_classes) if o.min_request == -1 else o


def validate(setup: Setup) -> None:
  """Raises ValueError for option values outside their ranges."""
  o = options(setup)
  if o.replay not in REPLAY_MODES:
    raise ValueError(f"method.replay={o.replay!r}; allowed: {REPLAY_MODES}")
  if not 0 < o.gamma < 1:
    raise ValueError(f"method.gamma={o.gamma!r}; allowed: a float in (0, 1)")
  if not o.alpha >= 0:
    raise ValueError(f"method.alpha={o.alpha!r}; allowed: a float >= 0")
  if not 0 <= o.p0 <= 1:
    raise ValueError(f"method.p0={o.p0!r}; allowed: a float in [0, 1]")
  if o.min_request < 0:   # the config layer has already checked it is an int
    raise ValueError(f"method.min_request={o.min_request!r}; allowed: -1 (= L) or an "
                     "int >= 0")
  if o.replay == "adaptive" and not 0 < o.p_min <= o.p0 <= o.p_max <= 1:
    raise ValueError(f"method.p_min={o.p_min!r}, p0={o.p0!r}, p_max={o.p_max!r}; "
                     "allowed: 0 < p_min <= p0 <= p_max <= 1")


def proportion_cap(setup: Setup) -> float:
  """The largest sampling proportion a round can use (static)."""
  o = options(setup)
  return {"adaptive": o.p_max, "fixed": o.p0, "off": 0.0}[o.replay]


def replay_sizes(setup: Setup) -> tuple[int, int]:
  """Static ``(replay list length, replay share per step)`` of one branch.

  A quota totals at most ``max(m, |D_i| p) <= max(m, floor(max_size p_cap))``
  samples (``m = min_request``) and a batch's share at most ``ceil(Q / nb)
  <= m + floor(B p_cap) + 1`` (``nb >= |D_i| / B``); one extra slot absorbs
  float32 rounding.  Both are 0 with replay off.
  """
  o = options(setup)
  pc = proportion_cap(setup)
  m = o.min_request if o.replay != "off" else 0
  if pc <= 0 and m == 0:
    return 0, 0
  cap = max(math.floor(setup.max_size * pc), m) + 1
  return cap, min(cap, math.floor(setup.batch_size * pc) + 1 + m)


@struct.dataclass
class State:
  part1: tuple           # client portions wc_i, leading branch axis (n, ...)
  part1_stats: tuple
  part2: tuple           # server portions ws_i, leading branch axis
  part2_stats: tuple
  server_opt: object     # per-branch server optimiser states
  score_num: jax.Array   # (n, L) sum_j gamma^(r-j) L_i[j]
  score_den: jax.Array   # () sum_j gamma^(r-j)
  p: jax.Array           # () sampling proportion of the next round
  fgn_prev: jax.Array    # () FGN of the last round
  g_hist: jax.Array      # (W + 1,) gradient signal of the last W + 1 rounds, oldest
                         # first; zeros before round 0 (as the authors pad it)
  round: jax.Array


def init(setup: Setup, key) -> State:
  """n identical branches (one initial model copied), empty score history,
  ``p = p_0`` (0 with replay off).  Its options are checked host-side by
  ``validate`` (the runner's hook): alpha, gamma and p_min may be traced
  per-slot values here."""
  params, stats = setup.model.init(key)
  c, n = setup.cut, setup.clients_per_round
  tx = make_optimizer(setup.momentum, setup.weight_decay)
  part2 = broadcast(params[c:], n)
  p0 = 0.0 if options(setup).replay == "off" else options(setup).p0
  return State(broadcast(params[:c], n), broadcast(stats[:c], n),
               part2, broadcast(stats[c:], n), jax.vmap(tx.init)(part2),
               jnp.zeros((n, setup.num_classes), jnp.float32),
               jnp.zeros((), jnp.float32), jnp.asarray(p0, jnp.float32),
               jnp.zeros((), jnp.float32),
               jnp.zeros((options(setup).clp_window + 1,), jnp.float32),
               jnp.zeros((), jnp.int32))


# ------------------------------------------------------- knowledge replay
def update_scores(num, den, counts, gamma):
  """Eq. 2 as a recurrence: ``num <- gamma num + L_i[r]``, ``den <- gamma den + 1``.

  Args:
    num: ``(..., L)`` decayed label-count sums.
    den: decayed weight sum (scalar or broadcastable).
    counts: ``(..., L)`` this round's label counts ``L_i[r]``.
    gamma: decay in (0, 1).

  Returns:
    ``(num, den, sv)`` with ``sv = num / den`` the score vectors.
  """
  num = gamma * num + counts.astype(jnp.float32)
  den = gamma * den + 1.0
  return num, den, num / den


def update_scores_authors(sv, w, counts, gamma):
  """The authors' score recursion: ``w <- gamma w + 1``,
  ``sv <- (gamma sv + L_i[r]) / w`` on the already normalised ``sv``.

  Unlike Eq. 2 it decays the previous score twice (once by gamma, once
  through the normalisation), so the previous round's weight relative to the
  current one is gamma, then 1/3, then tends to gamma^2 (0.25 at gamma 0.5).

  Returns:
    ``(sv, w, sv)``: the state's ``(score_num, score_den)`` hold ``sv`` and
    ``w`` under this rule, and the score vectors.
  """
  w = gamma * w + 1.0
  sv = (gamma * sv + counts.astype(jnp.float32)) / w
  return sv, w, sv


def priorities(sv):
  """Eq. 3: ``prior_c = max(0, mean(sv) - sv[c])`` along the last axis."""
  return jnp.maximum(0.0, jnp.mean(sv, axis=-1, keepdims=True) - sv)


def quotas(sv, size, p, min_request=0, rounding="spec"):
  """Eq. 4: ``q_c = floor(|D_i| p prior_c / sum_c prior_c)``; 0 if all priors are 0.

  With ``min_request = m > 0`` the total ``|D_i| p`` becomes ``max(m, |D_i| p)``
  (the floor the authors' code puts under a branch's request, there ``m = L``;
  SPEC 4.4 has none, ``m = 0``).

  Args:
    sv: ``(L,)`` score vector.
    size: the main client's sample count ``|D_i|``.
    p: the round's sampling proportion.
    min_request: smallest total request ``m`` (static int).
    rounding: ``"spec"`` floors ``total * share_c``; ``"authors"`` floors the
      total first (``max(m, int(|D_i| p))``), then ``total * share_c``.

  Returns:
    ``(L,)`` int32 samples requested per class.
  """
  prior = priorities(sv)
  total = jnp.sum(prior)
  share = jnp.where(total > 0, prior / jnp.where(total > 0, total, 1.0), 0.0)
  request = size.astype(jnp.float32) * p
  if rounding == "authors":  # int(|D_i| p) first, then each class's share of it
    request = jnp.floor(request)
  if min_request:
    request = jnp.maximum(request, jnp.float32(min_request))
  return jnp.floor(request * share).astype(jnp.int32)


def assistant_takes(key, holdings, active, quota):
  """Knowledge extraction of one branch: who contributes how many of each class.

  The clients that may assist are visited in a random order; each gives
  ``min(outstanding quota, its holdings)`` of every class (Algorithm 1 lines
  12-17), so a class's quota is filled exactly when they hold enough of it,
  and never exceeded.

  Args:
    key: PRNG key of the branch.
    holdings: ``(K, L)`` int label counts of every client.
    active: ``(K,)`` bool, the clients that never assist this branch (this
      round's main clients, or only the branch's own: ``assistants``).
    quota: ``(L,)`` int requested samples per class.

  Returns:
    ``(K, L)`` int32 samples of class l taken from client k.
  """
  K = holdings.shape[0]
  order = jnp.argsort(jnp.where(active, 2.0, jax.random.uniform(key, (K,))))
  avail = jnp.where(active[:, None], 0, holdings).astype(jnp.int32)[order]
  before = jnp.cumsum(avail, axis=0) - avail
  take = jnp.clip(quota[None, :].astype(jnp.int32) - before, 0, avail)
  return jnp.zeros_like(take).at[order].set(take)


def _groups(table, sizes, y, num_classes: int):
  """Group ``k*L + l`` of every table entry (``K*L`` for padding)."""
  K, M = table.shape
  owner = jnp.arange(K * M) // M
  valid = jnp.arange(K * M) % M < sizes[owner]
  return jnp.where(valid, owner * num_classes + y[table.reshape(-1)], K * num_classes)


def client_holdings(table, sizes, y, num_classes: int):
  """``(K, L)`` int32 label counts of every client, from its index table."""
  K = table.shape[0]
  group = _groups(table, sizes, y, num_classes)
  counts = jnp.bincount(group, length=K * num_classes + 1)[:-1]
  return counts.astype(jnp.int32).reshape(K, num_classes)


def class_pool(key, table, sizes, y, num_classes: int):
  """Every client's samples grouped by (client, class), randomly ordered.

  Args:
    key: PRNG key (the order within each group).
    table: ``(K, M)`` client index table (padded).
    sizes: ``(K,)`` valid entries per row.
    y: train labels.
    num_classes: L.

  Returns:
    ``(pool, start)``: ``pool`` ``(K*M,)`` sample indices sorted by group
    ``k*L + l`` (padding last), randomly within a group; ``start`` ``(K*L,)``
    the first position of every group (group sizes are
    :func:`client_holdings`).
  """
  group = _groups(table, sizes, y, num_classes)
  # Per-row draws keyed by client id: a client's order never depends on the
  # table's padded width, which is the widest client of all batched seeds.
  K, M = table.shape
  u = jax.vmap(lambda c: jax.random.uniform(jax.random.fold_in(key, c), (M,)))(
      jnp.arange(K))
  order = jnp.lexsort((u.reshape(-1), group))
  holdings = jnp.bincount(group, length=table.shape[0] * num_classes + 1)[:-1]
  start = (jnp.cumsum(holdings) - holdings).astype(jnp.int32)
  return table.reshape(-1)[order], start


def replay_slots(key, take, pool, start, holdings, cap: int):
  """The replay list of one branch: sample indices of ``take``, shuffled.

  Group (k, l) contributes ``take[k, l]`` consecutive entries of its randomly
  ordered pool group starting at a random offset (wrapping), so the samples
  are a uniform draw without replacement from client k's class-l data.

  Args:
    key: PRNG key of the branch.
    take: ``(K, L)`` from :func:`assistant_takes`.
    pool, start: from :func:`class_pool`.
    holdings: ``(K, L)`` from :func:`client_holdings`.
    cap: static list length (``replay_sizes``).

  Returns:
    ``(idx, valid)`` of shape ``(cap,)``: sample indices, valid ones first in
    random order.
  """
  k_off, k_shuf = jax.random.split(key)
  t, h = take.reshape(-1), holdings.reshape(-1)
  ends = jnp.cumsum(t)
  s = jnp.arange(cap)
  g = jnp.minimum(jnp.searchsorted(ends, s, side="right"), t.size - 1)
  j = s - (ends[g] - t[g])
  off = jnp.floor(jax.random.uniform(k_off, h.shape) * h).astype(jnp.int32)
  hg = jnp.maximum(h[g], 1)
  idx = pool[start[g] + (off[g] + j) % hg]
  valid = s < ends[-1]
  o = jnp.argsort(jnp.where(valid, jax.random.uniform(k_shuf, (cap,)), 2.0))
  return idx[o], valid[o]


def step_shares(idx, valid, size, batch_size: int, steps: int, per_step: int):
  """Spreads a replay list over the main client's batches of one epoch.

  Batch b of ``nb = ceil(size / B)`` gets slots
  ``[floor(b Q / nb), floor((b+1) Q / nb))`` of the ``Q`` valid ones.

  Returns:
    ``(idx, mask)`` of shape ``(steps, per_step)``.
  """
  q = jnp.sum(valid).astype(jnp.int32)
  nb = jnp.maximum((size + batch_size - 1) // batch_size, 1)
  b = jnp.arange(steps)[:, None]
  pos = (b * q) // nb + jnp.arange(per_step)[None, :]
  mask = (pos < ((b + 1) * q) // nb) & (b < nb)
  return idx[jnp.minimum(pos, idx.shape[0] - 1)], mask


def authors_shares(key, idx, valid, size, batch_size: int, epochs: int, steps: int,
                   per_step: int):
  """The authors' helper batches of one branch, every step of the round.

  Their helper loader has batches of ``h = ceil(Q / nb)`` (``Q`` replay
  samples, ``nb = ceil(size / B)`` main batches); main batch b of an epoch
  gets the b-th batch of a fresh shuffle of the list, so the first
  ``ceil(Q / h)`` batches get one (the last maybe shorter) and a sample can
  come twice in an epoch or not at all.

  Returns:
    ``(idx, mask)`` of shape ``(epochs * steps, per_step)``.
  """
  q = jnp.sum(valid).astype(jnp.int32)
  nb = jnp.maximum((size + batch_size - 1) // batch_size, 1)
  h = jnp.maximum((q + nb - 1) // nb, 1)
  j = jnp.arange(per_step)

  def one(k, t):
    b = t % steps
    order = jnp.argsort(jnp.where(valid, jax.random.uniform(k, valid.shape), 2.0))
    pos = b * h + j
    mask = (j < h) & (pos < q) & (b < nb)
    return idx[order][jnp.minimum(pos, idx.shape[0] - 1)], mask
  T = epochs * steps
  return jax.vmap(one)(jax.random.split(key, T), jnp.arange(T))


def fgn(grad_sums, steps, lr):
  """Eq. 5: ``mean_i -lr ||g_i||^2`` with ``g_i = grad_sums_i / steps_i``.

  Args:
    grad_sums: pytree with a leading branch axis, the summed server-portion
      gradients of every branch.
    steps: ``(n,)`` server steps of every branch.
    lr: eta.
  """
  sq = sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1)
           for a in jax.tree.leaves(grad_sums))
  steps = jnp.maximum(steps, 1).astype(jnp.float32)
  return jnp.mean(-lr * sq / steps ** 2)


def next_proportion(p, fgn_now, fgn_prev, has_prev, p_min, p_max):
  """SPEC 4.6: ``clip(p (1 + (FGN(r) - FGN(r-1)) / |FGN(r-1)|), p_min, p_max)``.

  ``p`` is kept in the first round, when ``FGN(r-1) = 0``, or when the update
  is not finite.
  """
  denom = jnp.abs(fgn_prev)
  rel = (fgn_now - fgn_prev) / jnp.where(denom > 0, denom, 1.0)
  new = jnp.clip(p * (1.0 + rel), p_min, p_max)
  ok = has_prev & (denom > 0) & jnp.isfinite(new)
  return jnp.where(ok, new, p)


def push_signal(hist, g):
  """The signal history with this round's ``g`` appended (oldest dropped)."""
  return jnp.concatenate([hist[1:], jnp.reshape(g, (1,)).astype(hist.dtype)])


def windowed_change(hist):
  """The authors' CLP test on ``hist`` (W + 1 rounds, newest last): the
  relative change from the mean of the W rounds before the newest to the
  mean of the last W (old mean floored at 1e-7).  It is positive exactly
  when the newest signal exceeds the one W rounds earlier; the zeros padding
  the first W rounds make every early round a critical one."""
  old = jnp.maximum(jnp.mean(hist[:-1]), 1e-7)
  return (jnp.mean(hist[1:]) - old) / old


def clp_proportion(p, delta, p_min, p_threshold, p_step):
  """The authors' ``--DB 1`` rule: in a critical learning period (``delta >
  0``) p doubles up to ``p_threshold``, then grows by ``p_step`` a round;
  otherwise it halves, down to ``p_min``."""
  grow = jnp.where(p >= p_threshold, p + p_step, jnp.minimum(p_threshold, 2.0 * p))
  return jnp.where(delta > 0, grow, jnp.maximum(p_min, p / 2.0))


def relative_proportion(p, delta, round_, p_min, p_late_min):
  """The authors' ``--DB 2`` rule: ``p (1 + delta)``, floored at ``p_min``
  in rounds 1-10 and at ``p_late_min`` later; unchanged after round 0."""
  floor = jnp.where(round_ > 10, p_late_min, p_min)
  return jnp.where(round_ != 0, jnp.maximum(floor, p * (1.0 + delta)), p)


def signal(sq_sums, lr, local_epochs):
  """The authors' gradient signal of a round: per branch ``lr`` times the
  mean over epochs of the epoch's summed per-step ``2|g_c|^2 + |g_s|^2``,
  then the mean over branches."""
  return jnp.mean(lr * sq_sums / local_epochs)


def sq_norm(tree):
  return sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree))


# ------------------------------------------------------------ the round
class Decisions(NamedTuple):
  """A round's random and data-dependent decisions, before any training."""

  clients: jax.Array     # (n,) main client of every branch
  sizes: jax.Array       # (n,) their sample counts
  idx: jax.Array         # (T, n, B) main batches of every step
  mask: jax.Array        # (T, n, B)
  counts: jax.Array      # (n, L) L_i[r]
  score_num: jax.Array   # (n, L) updated
  score_den: jax.Array   # () updated
  quota: jax.Array       # (n, L) requested per class
  take: jax.Array        # (n, K, L) taken from every assistant
  ridx: jax.Array        # (T, n, R) replay share of every step
  rmask: jax.Array       # (T, n, R)
  served: jax.Array      # (n, L) replayed per class (one epoch)
  lr: jax.Array          # the round's learning rate


def decide(setup: Setup, state: State, data, key) -> Decisions:
  """Main clients, batches, scores, quotas and the replay of one round.

  Pure and jittable; :func:`round` calls it with the round's key (tests call
  it to replay the same decisions in a loop reference).
  """
  o = options(setup)
  k_plan, k_branch, k_pool, k_take, k_slots = jax.random.split(key, 5)
  plan = plan_round(setup, data, k_plan, state.round)
  n, K, L = setup.clients_per_round, setup.num_clients, setup.num_classes
  perm = jax.random.permutation(k_branch, n)
  clients, sizes = plan.clients[perm], plan.sizes[perm]
  idx, mask = plan.idx[:, perm], plan.mask[:, perm]
  holdings = client_holdings(data["table"], data["sizes"], data["y"], L)
  counts = holdings[clients]
  update = update_scores_authors if o.score_update == "authors" else update_scores
  num, den, sv = update(state.score_num, state.score_den, counts, o.gamma)
  cap, per_step = replay_sizes(setup)
  T = idx.shape[0]
  if cap == 0:
    quota = jnp.zeros((n, L), jnp.int32)
    take = jnp.zeros((n, K, L), jnp.int32)
    ridx = jnp.zeros((T, n, 0), jnp.int32)
    rmask = jnp.zeros((T, n, 0), bool)
    return Decisions(clients, sizes, idx, mask, counts, num, den, quota, take,
                     ridx, rmask, jnp.zeros((n, L), jnp.int32), plan.lr)
  pool, start = class_pool(k_pool, data["table"], data["sizes"], data["y"], L)
  quota = jax.vmap(lambda s, z: quotas(s, z, state.p, o.min_request,
                                      o.request_rounding))(sv, sizes)
  if o.assistants == "inactive":
    excluded = jnp.broadcast_to(jnp.zeros(K, bool).at[clients].set(True), (n, K))
  else:  # only the branch's own main client stays out
    excluded = jax.nn.one_hot(clients, K, dtype=bool)
  take = jax.vmap(lambda k, q, ex: assistant_takes(k, holdings, ex, q))(
      jax.random.split(k_take, n), quota, excluded)
  slots, valid = jax.vmap(lambda k, t: replay_slots(k, t, pool, start, holdings, cap))(
      jax.random.split(k_slots, n), take)
  t_ep = T // setup.local_epochs
  if o.replay_schedule == "authors":
    # A key of its own, folded from k_slots: the other draws stay as they were.
    sidx, smask = jax.vmap(lambda k, i, v, s: authors_shares(
        k, i, v, s, setup.batch_size, setup.local_epochs, t_ep, per_step))(
            jax.random.split(jax.random.fold_in(k_slots, 1), n), slots, valid, sizes)
    served = jnp.sum(jax.nn.one_hot(data["y"][slots], L, dtype=jnp.int32)
                     * valid[..., None], axis=1)              # the replay list
    ridx, rmask = sidx.transpose(1, 0, 2), smask.transpose(1, 0, 2)
  else:
    sidx, smask = jax.vmap(
        lambda i, v, s: step_shares(i, v, s, setup.batch_size, t_ep, per_step))(
            slots, valid, sizes)                              # (n, t_ep, R)
    served = jnp.sum(jax.nn.one_hot(data["y"][sidx], L, dtype=jnp.int32)
                     * smask[..., None], axis=(1, 2))
    # The same shares every epoch.
    ridx = jnp.tile(sidx.transpose(1, 0, 2), (setup.local_epochs, 1, 1))
    rmask = jnp.tile(smask.transpose(1, 0, 2), (setup.local_epochs, 1, 1))
  return Decisions(clients, sizes, idx, mask, counts, num, den, quota, take,
                   ridx, rmask, served, plan.lr)


class Branches(NamedTuple):
  """The server carry of a MultiSFL round (every leaf with a leading branch
  axis n)."""

  server: Portion  # the server portions ws_i
  gsum: tuple            # running sum of ws_i's loss gradients (FGN)
  sqsum: jax.Array       # (n,) running sum of 2|g_client|^2 + |g_server|^2 (the
                         # authors' signal counts the client portion twice: their
                         # running total is not reset between the two portions)
  replay_model: tuple    # (params, stats) the wc_i copy computing replay features


def branch_server(setup: Setup, tx, data, carry, act, y, mask, share):
  """The server side of one split step of one branch with its replay share
  (Algorithm 1, lines 18-20).

  Args:
    setup, tx, data: as for every method.
    carry: the branch's :class:`Branches` slice.
    act, y, mask: ``(B, ...)`` the main client's cut-layer features, labels
      and mask.
    share: ``(ridx, rmask)``, ``(R,)`` this step's replay share.

  Returns:
    ``(carry, gradient w.r.t. act, loss sum)``; a no-op on an empty main
    batch.
  """
  server, (f1, fs1) = carry.server, carry.replay_model
  ridx, rmask = share
  active = jnp.any(mask)
  if ridx.shape[0]:
    xr, yr = batching.gather(data, ridx)
    ract = lax.stop_gradient(setup.model.apply(f1, fs1, xr, train=True, mask=rmask)[0])
    m_all = jnp.concatenate([mask, rmask])
    if options(setup).server_forward == "separate":
      loss, ns2, g2, g_a = separate_server_grads(setup, server.params, server.stats, act, y,
                                                 mask, ract, yr, rmask)
    else:
      loss, _, ns2, g2, g_a = split.server_grads(
          setup, server.params, server.stats, jnp.concatenate([act, ract]),
          jnp.concatenate([y, yr]), m_all)
  else:
    m_all = mask
    loss, _, ns2, g2, g_a = split.server_grads(setup, server.params, server.stats, act, y,
                                               mask)
  carry = carry._replace(
      server=server.step(tx, g2, ns2, active),
      gsum=jax.tree.map(lambda a, g: a + jnp.where(active, g, 0.0), carry.gsum, g2),
      sqsum=carry.sqsum + jnp.where(active, sq_norm(g2), 0.0))
  count = jnp.where(active, jnp.sum(m_all), 0)
  return carry, g_a[:act.shape[0]], loss * count


def serve(setup: Setup, data):
  """MultiSFL's server rule: a server portion per branch (``split.parallel``),
  each fed its own main client's features and its replay share; the replay
  model is refreshed from the branch's client portion at an epoch's first
  step (``replay_model = "epoch"``)."""
  def make(plan, step: split.Step):
    t, ridx, rmask = step.extra
    t_ep = plan.idx.shape[0] // setup.local_epochs   # steps of one local epoch
    epoch_start = t % t_ep == 0

    def one(br: Branches, act, y, mask, inputs):
      share, client = inputs[:2], inputs[2:]
      if options(setup).replay_model == "epoch":  # a fresh copy of wc_i every epoch
        br = br._replace(replay_model=jax.tree.map(
            lambda new, old: jnp.where(epoch_start, new, old), client, br.replay_model))
      return branch_server(setup, plan.tx, data, br, act, y, mask, share)

    return split.parallel(one, (ridx, rmask, step.clients.params, step.clients.stats),
                          client_signal)
  return make


def client_signal(br: Branches, g1, active) -> Branches:
  """Adds the branch's ``2|g_client|^2`` to its gradient signal."""
  return br._replace(sqsum=br.sqsum + jnp.where(active, 2.0 * sq_norm(g1), 0.0))


def separate_server_grads(setup: Setup, p2, s2, act, y, mask, ract, yr, rmask):
  """The server portion on the main features, then on the replay features
  (two BatchNorm batches; the statistics updated by both, in that order, the
  second only where the step has replay), and the cross-entropy over the
  concatenated logits, as the authors' code computes it.

  Returns:
    ``(loss, new_stats2, grad w.r.t. p2, grad w.r.t. act)``.
  """
  def loss_fn(p, a):
    logits, mid = setup.model.apply(p, s2, a, start=setup.cut, train=True, mask=mask)
    rlogits, out = setup.model.apply(p, mid, ract, start=setup.cut, train=True,
                                     mask=rmask)
    out = gate(jnp.any(rmask), out, mid)
    return masked_cross_entropy(
        jnp.concatenate([logits, rlogits]), jnp.concatenate([y, yr]),
        jnp.concatenate([mask, rmask])), out

  (loss, ns), (g_p, g_a) = jax.value_and_grad(
      loss_fn, argnums=(0, 1), has_aux=True)(p2, act)
  return loss, ns, g_p, g_a


def pull_back(stacked, alpha):
  """``w_i <- (w_i + alpha mean_j w_j) / (1 + alpha)`` over the leading axis."""
  return jax.tree.map(
      lambda a: ((a + alpha * jnp.mean(a, axis=0, keepdims=True)) / (1.0 + alpha)
                 ).astype(a.dtype), stacked)


def round_bytes(setup: Setup, main_samples, replay_samples, assistants):
  """Bytes ``(up, down)`` of a round (float32; SPEC 1.4).

  Up: every main client's client portion, its activations and labels, and
  the replay features and labels.  Down: every main client's client portion
  and its activation gradients, and per assistant the branch's client
  portion and the per-class request (L int32).
  """
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n, L = setup.clients_per_round, setup.num_classes
  f = lambda v: jnp.asarray(v, jnp.float32)
  up = n * p1 + f(main_samples) * (act + LABEL_BYTES) + f(replay_samples) * (
      act + LABEL_BYTES)
  down = n * p1 + f(main_samples) * act + f(assistants) * (p1 + L * LABEL_BYTES)
  return up, down


def round(setup: Setup, state: State, data, key):
  """One MultiSFL round (module docstring, steps 1-6).

  Args:
    setup: static run description (``clients_per_round`` = n branches;
      method options ``replay``, ``p0``, ``p_min``, ``p_max``, ``gamma``,
      ``alpha``).
    state: see :class:`State`.
    data: device data (see ``jsfl.methods.base``).
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics as listed in the module docstring.
  """
  o = options(setup)
  d = decide(setup, state, data, key)
  n, T = setup.clients_per_round, d.idx.shape[0]
  # The branches' plan (``decide`` permuted the drawn one); no processing
  # order is drawn from it, the branches being served side by side.
  plan = RoundPlan(d.clients, d.sizes, d.idx, d.mask, key,
                   make_optimizer(setup.momentum, setup.weight_decay), d.lr)
  # Client-portion optimiser states are rebuilt every round; the server's per
  # ``server_opt``.
  server_opt = (state.server_opt if o.server_opt == "keep"
                else jax.vmap(plan.tx.init)(state.part2))
  start = Branches(
      Portion(state.part2, state.part2_stats,
                    jax.vmap(lambda s: with_lr(s, d.lr))(server_opt)),
      jax.tree.map(jnp.zeros_like, state.part2), jnp.zeros((n,), jnp.float32),
      (state.part1, state.part1_stats))
  out = split.split_round(
      setup, state, data, key, plan=plan, server=lambda _: start, serve=serve(setup, data),
      starts=lambda _: fresh_stack(plan, state.part1, state.part1_stats),
      aggregate=None, step_inputs=(jnp.arange(T), d.ridx, d.rmask))
  p1, s1 = out.clients.params, out.clients.stats
  p2, s2, opt2 = out.server.server.params, out.server.server.stats, out.server.server.opt
  gsum, sqsum = out.server.gsum, out.server.sqsum
  active = jnp.any(d.mask, axis=2)                             # (T, n)
  counts = jnp.where(active, jnp.sum(d.mask, axis=2) + jnp.sum(d.rmask, axis=2), 0)
  steps = jnp.sum(active, axis=0)                              # (n,)
  fgn_now = fgn(gsum, steps, d.lr)
  g_now = (signal(sqsum, d.lr, setup.local_epochs) if o.grad_signal == "authors"
           else -fgn_now)
  g_hist = push_signal(state.g_hist, g_now)
  delta = windowed_change(g_hist)
  if o.replay != "adaptive":
    p_next = state.p
  elif o.p_rule == "spec":
    p_next = next_proportion(state.p, fgn_now, state.fgn_prev, state.round > 0,
                             o.p_min, o.p_max)
  else:  # the authors' rules; p_max only bounds the static replay buffer
    p_next = (clp_proportion(state.p, delta, o.p_min, o.p_threshold, o.p_step)
              if o.p_rule == "clp" else
              relative_proportion(state.p, delta, state.round, o.p_min, o.p_late_min))
    p_next = jnp.minimum(p_next, o.p_max)
  new = state.replace(
      part1=pull_back(p1, o.alpha), part1_stats=pull_back(s1, o.alpha),
      part2=pull_back(p2, o.alpha), part2_stats=pull_back(s2, o.alpha),
      server_opt=opt2, score_num=d.score_num, score_den=d.score_den,
      p=p_next, fgn_prev=fgn_now, g_hist=g_hist, round=state.round + 1)
  samples = jnp.sum(d.mask)
  replay_samples = jnp.sum(d.rmask)
  assistants = jnp.sum(jnp.any(d.take > 0, axis=2), axis=1)   # (n,)
  if o.comm_accounting == "authors":
    up, down = authors_round_bytes(setup, samples, d.sizes, state.p, jnp.sum(assistants))
  else:
    up, down = round_bytes(setup, samples, jnp.sum(d.served), jnp.sum(assistants))
  metrics = {"loss": jnp.sum(out.loss_sums) / jnp.maximum(jnp.sum(counts), 1),
             "samples": samples, "clients": d.clients,
             "p": state.p, "p_next": p_next, "fgn": fgn_now, "grad_signal": g_now,
             "replay_requested": d.quota, "replay_served": d.served,
             "assistants": assistants, "replay_samples": replay_samples,
             "bytes_up": up, "bytes_down": down}
  return new, metrics


def authors_round_bytes(setup: Setup, main_samples, sizes, p, assistants):
  """Bytes ``(up, down)`` of a round as the authors' code counts its traffic:
  every branch's client portion down and up, the main features up and their
  gradients down for every sample of every epoch (no labels), per branch
  the requested ``max(m, int(|D_i| p))`` replay features up every epoch, and
  the client portion down to every assistant every epoch.  Their code adds
  it all into one total; here it is split as it travels."""
  o = options(setup)
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n, E = setup.clients_per_round, setup.local_epochs
  f = lambda v: jnp.asarray(v, jnp.float32)
  requested = 0.0
  if o.replay != "off":
    requested = jnp.sum(jnp.maximum(f(o.min_request),
                                    jnp.floor(sizes.astype(jnp.float32) * p)))
  up = n * p1 + f(main_samples) * act + requested * E * act
  down = n * p1 + f(main_samples) * act + f(assistants) * E * p1
  return up, down


def output_model(setup: Setup, state: State):
  """The master model: the branch mean (equal to the round's master, since the
  pull-back keeps the mean)."""
  mean = lambda t: jax.tree.map(lambda a: jnp.mean(a, axis=0), t)
  return (mean(state.part1) + mean(state.part2),
          mean(state.part1_stats) + mean(state.part2_stats))


def communication(setup: Setup, samples: int):
  """The replay-free bytes (SFL's); the round's metrics carry the full ones."""
  return split_communication(setup, samples)


METHOD = Method(init, round, output_model, communication, validate=validate)
