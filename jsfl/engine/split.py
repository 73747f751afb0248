"""The split round: one engine for every split-learning method.

A round of split learning has the same skeleton in every method of the
family: the round's participants and batches are drawn; then, segment by
segment of the server's schedule (:mod:`jsfl.engine.schedule`), every
participant of the segment runs its client portion (part-1) forward, the
server turns the cut-layer activations into activation gradients, and every
participant runs part-1 backward and steps its optimiser; at the end the
trained client portions are aggregated.  A method is a
:class:`SplitAlgorithm`: the same skeleton with its hooks filled in
(``docs/extending.md`` walks through them):

* ``server_init(state, plan)``: the server carry at the round's start, any
  pytree (SFL's part-2, Hydra's part-2a and stacked heads, a part-2 per
  client);
* ``server_rule(state, plan, step)``: how a segment's activations become
  gradients: a :class:`SequentialServer` (one carry, participant after
  participant: SFL, Hydra), a :class:`MergedServer` (one update on the
  concatenated batch: MergeSFL) or a :class:`PerClientServer` (a carry per
  participant, each participant's whole step in one piece: SplitFedV1/V3,
  MultiSFL's branches);
* ``schedule(setup, state, plan, data)``: the segments of the round and the
  serving order in each (:func:`label_cycle`, the run's label cycle under
  ``setup.order``; :func:`batch_steps`, batch step by batch step in
  ascending participant order);
* ``client_init(state, plan)``: the participants' starting client portions
  (default :func:`global_part1`: the global part-1 broadcast, fresh
  optimiser states); ``client_select`` / ``client_place``: which of them a
  segment trains and where it goes back (default: all of them, in place);
* ``client_final(clients, plan)``: the trained client portions to the next
  global part-1 (default: their mean under ``method.aggregation``; None keeps
  them apart);
* ``plan(setup, state, data, key)``: the round's random decisions (default
  :func:`plan_at_round`: :func:`jsfl.core.plan.plan_round` at ``state.round``); a
  method's planner may put what it derives from the data into
  ``RoundPlan.context`` for its other hooks.

A method builds its :class:`SplitAlgorithm` once per run (its hooks close
over the run's setup, never over a state) and :class:`SplitRounds` runs it:
``init(key)``, ``round(state, data, key)``.

The server loss is the :func:`server_update` argument of a rule
(cross-entropy by default).  The participants' part-1 steps with
``setup.client_tx`` and the server's portions with the plan's ``tx``: the
same optimiser except under ``optim.weight_decay_scope = "part2"``, where
only the server's part-2 is weight-decayed (Hydra App. H.5).  Every
optimiser step is gated on the batch mask through
:class:`~jsfl.core.portion.Portion`, so a participant without data at a step
(or a server serving an empty batch) leaves parameters, BatchNorm statistics
and optimiser state untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core.clients import map_clients
from jsfl.core.data import gather, training_data
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.plan import RoundPlan, plan_round, round_metrics
from jsfl.core.portion import Portion, fresh_stack
from jsfl.core.trees import broadcast, weighted_mean
from jsfl.engine import schedule
from jsfl.engine.orders import cycle_places
from jsfl.engine.steps import StepModels, scan_live


# ----------------------------------------------------------- server losses
def cross_entropy(logits, y, mask):
  """The default server loss: ``(mean cross-entropy, reported loss, extra)``."""
  ce = masked_cross_entropy(logits, y, mask)
  return ce, ce, jnp.zeros((), jnp.float32)


def server_grads(setup, params, stats, act, y, mask, loss=cross_entropy):
  """A server portion's loss on one batch of activations and its gradients.

  Returns:
    ``(reported, extra, new stats, grad w.r.t. params, grad w.r.t. act)``;
    ``loss`` as for :func:`server_update`.
  """
  def objective(p, a):
    logits, ns = setup.model.apply(p, stats, a, start=setup.cut, train=True, mask=mask)
    obj, reported, extra = loss(logits, y, mask)
    return obj, (ns, reported, extra)

  (_, (ns, reported, extra)), (g_p, g_a) = jax.value_and_grad(
      objective, argnums=(0, 1), has_aux=True)(params, act)
  return reported, extra, ns, g_p, g_a


def server_update(setup, tx, server: Portion, act, y, mask, loss=cross_entropy):
  """One update of a single server portion on one batch of activations.

  Args:
    setup: static run description (model and cut).
    tx: the optimiser.
    server: the server portion (stages ``[cut, end)``).
    act, y, mask: the cut-layer activations, labels and mask.
    loss: ``(logits, y, mask) -> (objective, reported, extra)``: the
      objective is differentiated; ``reported`` (the loss metric) and
      ``extra`` (a second per-sample quantity, e.g. a regulariser) are
      accumulated as sums over samples.

  Returns:
    ``(server, gradient w.r.t. act, reported sum, extra sum)``; a no-op on
    an empty batch.
  """
  reported, extra, ns, g_p, g_a = server_grads(setup, server.params, server.stats, act,
                                               y, mask, loss)
  count = jnp.sum(mask)
  return server.step(tx, g_p, ns, jnp.any(mask)), g_a, reported * count, extra * count


# -------------------------------------------------------------- server rules
class SequentialServer(NamedTuple):
  """One server carry updated participant after participant in the
  segment's serving order.

  ``step(server, act, y, mask, k) -> (server, g_act, loss_sum)`` serves
  participant ``k``; it is skipped (``lax.cond``) for a participant without
  a batch in the segment.  ``unroll``: the serving scan's unroll factor.
  """

  step: Callable
  unroll: int = 1


class MergedServer(NamedTuple):
  """The segment's batches as one server batch: one
  ``step(server, act, y, mask, None)`` on their concatenation.

  ``per_client_mean``: each participant gets the gradient of its own batch's
  mean loss (the merged mean's gradient times merged samples / its samples,
  as the Hydra authors' MergeSFL sends it); else its share of the merged
  mean's gradient.
  """

  step: Callable
  per_client_mean: bool = False


class PerClientServer(NamedTuple):
  """A server carry per participant (leading axis n), served side by side.

  The participants are independent within a segment, so each one's whole
  step runs in one piece, mapped over the participants (``client_exec``);
  with looped clients a participant without a batch skips its piece
  outright.  ``piece(setup, tx, client, server_k, x, y, mask, k) ->
  (client, server_k, loss_sum)``, ``k`` the participant's position.
  :func:`per_client` builds the usual piece from a server step.
  """

  piece: Callable


def client_forward(setup, client: Portion, x, mask):
  """A participant's part-1 forward with its VJP: ``(act, vjp, new_stats)``."""
  return jax.vjp(lambda p: setup.model.apply(p, client.stats, x, train=True, mask=mask),
                 client.params, has_aux=True)


def per_client(step: Callable) -> PerClientServer:
  """A :class:`PerClientServer` whose piece is part-1 forward, ``step(server_k,
  act, y, mask, k) -> (server_k, g_act, loss_sum)``, part-1 backward and the
  gated client step."""
  def piece(setup, tx, client: Portion, srv, x, y, mask, k):
    act, vjp, ns = client_forward(setup, client, x, mask)
    srv, g_a, lsum = step(srv, act, y, mask, k)
    (g1,) = vjp(g_a)
    return client.step(tx, g1, ns, jnp.any(mask)), srv, lsum
  return PerClientServer(piece)


def part2_copies(state, plan) -> Portion:
  """Every participant's copy of ``state.part2``, each with a fresh
  optimiser (SplitFedV1, SplitFedV3)."""
  n = plan.clients.shape[0]
  return fresh_stack(plan, broadcast(state.part2, n), broadcast(state.part2_stats, n))


def own_part2(setup) -> ServerRule:
  """Each participant trains its own part-2 copy (SplitFedV1, SplitFedV3)."""
  def rule(state, plan, step):
    def one(srv, act, y, mask, _):
      srv, g_a, lsum, _ = server_update(setup, plan.tx, srv, act, y, mask)
      return srv, g_a, lsum
    return per_client(one)
  return rule


# ---------------------------------------------------------------- the round
class Step(NamedTuple):
  """A segment's inputs, for server rules that need more than the
  activations (FedNTD's teacher sees the raw inputs; MultiSFL reads its
  replay shares at ``position``)."""

  x: jax.Array      # (n, B, ...) normalised inputs
  y: jax.Array      # (n, B) labels
  idx: jax.Array    # (n, B) sample indices
  mask: jax.Array   # (n, B)
  position: jax.Array  # the segment's place in the schedule (the batch step
                       # under batch_steps)


def averaged(clients: Portion, plan):
  """The mean of the trained client portions under the run's aggregation
  weights (``plan.weights``: sample counts, FedAvg's, or one per client)."""
  return (weighted_mean(clients.params, plan.weights),
          weighted_mean(clients.stats, plan.weights))


def uniform(clients: Portion, plan):
  """The plain mean of the trained client portions, whatever the run's
  aggregation (SplitFedV3's part-2 copies)."""
  w = jnp.ones_like(plan.sizes, jnp.float32)
  return weighted_mean(clients.params, w), weighted_mean(clients.stats, w)


class ServerInit(Protocol):
  def __call__(self, state: Any, plan: RoundPlan) -> Any: ...


class ServerRule(Protocol):
  def __call__(self, state: Any, plan: RoundPlan,
               step: Step) -> SequentialServer | MergedServer | PerClientServer: ...


class Schedule(Protocol):
  def __call__(self, setup, state: Any, plan: RoundPlan, data) -> schedule.Schedule: ...


class ClientInit(Protocol):
  def __call__(self, state: Any, plan: RoundPlan) -> Portion: ...


class ClientFinal(Protocol):
  def __call__(self, clients: Portion, plan: RoundPlan) -> tuple[Any, Any]: ...


class ClientSelect(Protocol):
  def __call__(self, clients: Portion, plan: RoundPlan, step: Step) -> Portion: ...


class ClientPlace(Protocol):
  def __call__(self, clients: Portion, current: Portion, plan: RoundPlan,
               step: Step) -> Portion: ...


class Planner(Protocol):
  def __call__(self, setup, state: Any, data, key: jax.Array) -> RoundPlan: ...


def plan_at_round(setup, state, data, key) -> RoundPlan:
  """The default planner: :func:`jsfl.core.plan.plan_round` at the round
  ``state.round``."""
  return plan_round(setup, data, key, state.round)


def label_cycle(setup, state, plan: RoundPlan, data) -> schedule.Schedule:
  """The sequential server's schedule: ``setup.order`` over the run's label
  cycle ``state.label_rank`` (or client cycle, ``method.cycle``) under
  ``setup.order_rule``."""
  return schedule.round_schedule(setup, plan.order_key, plan.mask, plan.clients,
                                 cycle_places(setup, data.dominant), state.label_rank)


def batch_steps(setup, state, plan: RoundPlan, data) -> schedule.Schedule:
  """Batch step by batch step, every participant in ascending id order
  (servers whose result does not depend on an order)."""
  n, num_steps = setup.clients_per_round, plan.idx.shape[0]
  return schedule.steps(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (num_steps, n)))


def global_part1(state, plan: RoundPlan) -> Portion:
  """Every participant starts from the global part-1 (``state.part1``) with a
  fresh optimiser state."""
  n = plan.clients.shape[0]
  return fresh_stack(plan, broadcast(state.part1, n), broadcast(state.part1_stats, n))


@dataclasses.dataclass(frozen=True)
class SplitAlgorithm:
  """A split method's round: the shared skeleton's hooks (module docstring),
  built once per run."""

  server_init: ServerInit
  server_rule: ServerRule
  schedule: Schedule
  client_init: ClientInit = global_part1
  client_final: ClientFinal | None = averaged
  client_select: ClientSelect | None = None
  client_place: ClientPlace | None = None
  plan: Planner = plan_at_round


class SplitRound(NamedTuple):
  """A split round's outcome, before the method writes its next state."""

  plan: RoundPlan
  orders: jax.Array      # (S, n) serving order of every segment (schedule.py)
  clients: Portion       # (n, ...) trained client portions
  part1: Any             # aggregated part-1 params (None: not aggregated)
  part1_stats: Any
  server: Any            # the server carry after the round
  loss_sums: jax.Array   # (S,)
  steps: Any = None      # StepModels of a watched round (run_round's ``watch``)


class Watch(NamedTuple):
  """What :func:`run_round` records of a round: the model after each of its
  first ``steps`` steps, ``model(out)`` of the round as if it had ended
  there (``out`` a :class:`SplitRound` of the current client portions and
  server carry, its part-1 aggregated by ``client_final``)."""

  model: Callable[[SplitRound], Any]
  steps: int


def _round_start(alg: SplitAlgorithm, setup, state, data, key):
  """A round's plan, schedule, starting participants and their indices."""
  plan = alg.plan(setup, state, data, key)
  sched = alg.schedule(setup, state, plan, data)
  return plan, sched, alg.client_init(state, plan), jnp.arange(setup.clients_per_round)


def _segment(plan, data, who, segment) -> Step:
  """One schedule segment's batches (every participant's; a ``src`` < 0
  participant is masked out)."""
  position, src, _ = segment
  idx = plan.idx[jnp.maximum(src, 0), who]
  mask = plan.mask[jnp.maximum(src, 0), who] & (src >= 0)[:, None]
  x, y = gather(data, idx)
  return Step(x, y, idx, mask, position)


def _live_segments(plan, sched, who):
  """Which segments hold any real batch (the others are skipped), and the
  segments' positions."""
  has = jnp.any(plan.mask, axis=2)  # (T, n)
  live = jnp.any(has[jnp.maximum(sched.src, 0), who] & (sched.src >= 0), axis=1)
  return live, jnp.arange(sched.src.shape[0], dtype=jnp.int32)


def run_round(alg: SplitAlgorithm, setup, state, data, key,
              watch: Watch | None = None) -> SplitRound:
  """One round of a split method.

  Args:
    alg: the method's hooks.
    setup: the run's setup.
    state: the method's state (read only by the hooks).
    data: the round's :class:`~jsfl.core.data.RoundData`.
    key: the round's PRNG key.
    watch: None (a run's rounds), or what to record of the round
      (:class:`Watch`: the model after each step, into
      ``SplitRound.steps``); needs a :class:`SequentialServer` rule (its
      participants' part-1 run inside each visit, ``client_pass =
      per_visit``'s values) without ``client_select`` / ``client_place``.

  Returns:
    :class:`SplitRound`.
  """
  data = training_data(setup, data, key)
  if watch is not None:
    return watched_round(alg, setup, state, data, key, watch)
  plan, sched, clients, who = _round_start(alg, setup, state, data, key)

  def one_segment(carry, segment):
    step, order = _segment(plan, data, who, segment), segment[2]
    stack, srv = carry
    current = stack if alg.client_select is None else alg.client_select(stack, plan, step)
    current, srv, lsum = segment_step(setup, setup.client_tx, current, srv, step, order,
                                      alg.server_rule(state, plan, step))
    if alg.client_place is not None:
      current = alg.client_place(stack, current, plan, step)
    return (current, srv), lsum

  live, indices = _live_segments(plan, sched, who)
  (clients, srv), lsums = scan_live(
      one_segment, (clients, alg.server_init(state, plan)),
      (indices, sched.src, sched.order), live)
  part1, stats1 = alg.client_final(clients, plan) if alg.client_final else (None, None)
  return SplitRound(plan, sched.order, clients, part1, stats1, srv, lsums)


def watchable(alg: SplitAlgorithm) -> bool:
  """Whether :func:`run_round` can watch ``alg``'s steps: a sequential
  server's label-cycle schedule (:func:`label_cycle`) and participants that
  train the global part-1 in place and are aggregated (SFL, its variants
  but FedExp, Hydra)."""
  return (alg.schedule is label_cycle and alg.client_final is not None
          and alg.client_select is None and alg.client_place is None)


def watched_round(alg: SplitAlgorithm, setup, state, data, key, watch: Watch) -> SplitRound:
  """:func:`run_round` with ``watch``: the same segments, each visited
  participant after participant (:func:`visit_segment`), and before each
  visit that starts a new step (its participant's dominant label differs from
  the previous visit's) the model as it stands is written into a buffer of
  ``watch.steps`` models; after the last segment, the round's end model
  closes the last step.  Inside one program: no Python loop over visits."""
  if not watchable(alg) or alg.client_final is None:
    raise ValueError("run.step_confusion: a split method whose sequential server "
                     "serves the label cycle and whose participants train the global "
                     "part-1 in place; allowed: sfl and its variants but sfl_fedexp, "
                     "hydra")
  plan, sched, clients, who = _round_start(alg, setup, state, data, key)
  S = watch.steps
  label_of = data.dominant[plan.clients]  # (n,)

  def model_now(stack, srv):
    part1, stats1 = alg.client_final(stack, plan)
    return watch.model(SplitRound(plan, sched.order, stack, part1, stats1, srv,
                                  jnp.zeros(sched.order.shape[0], jnp.float32)))

  shapes = jax.eval_shape(model_now, clients, alg.server_init(state, plan))
  buf = jax.tree.map(lambda a: jnp.zeros((S,) + a.shape, a.dtype), shapes)
  obs0 = (buf, jnp.full((S,), -1, jnp.int32), jnp.zeros((), jnp.int32),
          jnp.full((), -1, jnp.int32))

  def record(obs, stack, srv, ends):
    """The model written at ``count`` where a step ``ends`` (the model is
    computed under ``lax.cond``, the write goes to a dropped index
    otherwise: under the seed vmap the buffer is never selected whole)."""
    buf, labels, count, prev = obs
    ends = ends & (prev >= 0) & (count < S)
    zeros = lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    model = lax.cond(ends, lambda: model_now(stack, srv), zeros)
    at = jnp.where(ends, count, S)
    buf = jax.tree.map(lambda b, m: b.at[at].set(m, mode="drop"), buf, model)
    return buf, labels.at[at].set(prev, mode="drop"), count + ends.astype(jnp.int32)

  def before_visit(obs, stack, srv, k, active):
    lab = label_of[k]
    buf, labels, count = record(obs, stack, srv, active & (lab != obs[3]))
    return buf, labels, count, jnp.where(active, lab, obs[3])

  def one_segment(carry, segment):
    step, order = _segment(plan, data, who, segment), segment[2]
    stack, srv, obs = carry
    rule = alg.server_rule(state, plan, step)
    if not isinstance(rule, SequentialServer):
      raise ValueError("run.step_confusion: a split method whose server serves "
                       "participant after participant; allowed: sfl and its variants, "
                       "hydra")
    stack, srv, lsum, obs = visit_segment(setup, setup.client_tx, stack, srv, step,
                                          order, rule, watch=(before_visit, obs))
    return (stack, srv, obs), lsum

  live, indices = _live_segments(plan, sched, who)
  (clients, srv, obs), lsums = scan_live(
      one_segment, (clients, alg.server_init(state, plan), obs0),
      (indices, sched.src, sched.order), live)
  buf, labels, count = record(obs, clients, srv, jnp.ones((), bool))
  part1, stats1 = alg.client_final(clients, plan)
  return SplitRound(plan, sched.order, clients, part1, stats1, srv, lsums,
                    StepModels(buf, labels, count))


@dataclasses.dataclass(frozen=True)
class SplitRounds:
  """A split method for one run: its :class:`SplitAlgorithm`, built once,
  with the state it starts from and the state a round leaves
  (``finish(setup, state, out) -> (state, metrics)``).  ``init(key)`` and
  ``round(state, data, key)`` are what the run's programs call."""

  setup: Any
  algorithm: SplitAlgorithm
  start: Callable[[Any, jax.Array], Any]
  finish: Callable[[Any, Any, SplitRound], tuple[Any, dict]]

  def init(self, key):
    return self.start(self.setup, key)

  def round(self, state, data, key):
    out = run_round(self.algorithm, self.setup, state, data, key)
    return self.finish(self.setup, state, out)

  def watched_round(self, state, data, key, output_model: Callable, steps: int):
    """:meth:`round` that also returns the :class:`StepModels` of its first
    ``steps`` steps, each model ``output_model(setup, state)`` of the state
    the round would leave had it ended after that step (the last step's is
    the round's own next state's)."""
    def model(out):
      return output_model(self.setup, self.finish(self.setup, state, out)[0])
    out = run_round(self.algorithm, self.setup, state, data, key, Watch(model, steps))
    new, metrics = self.finish(self.setup, state, out)
    return new, metrics, out.steps


def segment_step(setup, tx, clients: Portion, server, step: Step, order, rule):
  """One segment: the participants' part-1 forward, the server rule, part-1
  backward and a gated step of every participant that had a batch (for a
  :class:`PerClientServer`, each participant's piece).  ``tx`` is the
  participants' optimiser (``setup.client_tx`` in :func:`run_round`); a
  server rule steps its portions with ``plan.tx``.

  Returns:
    ``(clients, server, loss_sum)``.
  """
  if isinstance(rule, PerClientServer):
    return per_client_segment(setup, tx, clients, server, step, rule)
  if isinstance(rule, SequentialServer) and setup.client_pass == "per_visit":
    return visit_segment(setup, tx, clients, server, step, order, rule)
  has = jnp.any(step.mask, axis=1)

  def part1(pp, s, xx, m):
    run = lambda: setup.model.apply(pp, s, xx, train=True, mask=m)
    if setup.client_exec == "vmap":
      return run()
    # Looped clients: a client without a batch skips its forward (and so its
    # backward); its output is discarded by the gated step.
    act = jax.eval_shape(run)[0]
    return lax.cond(jnp.any(m), run, lambda: (jnp.zeros(act.shape, act.dtype), s))

  forward = lambda p: map_clients(part1, setup.client_exec, p, clients.stats, step.x,
                                  step.mask)
  acts, vjp_fn, new_stats = jax.vjp(forward, clients.params, has_aux=True)
  if isinstance(rule, SequentialServer):
    server, g_acts, lsum = serve_in_order(rule, server, acts, step.y, step.mask, order)
  elif isinstance(rule, MergedServer):
    server, g_acts, lsum = serve_merged(rule, server, acts, step.y, step.mask)
  else:
    raise TypeError(f"server rule {type(rule).__name__}; allowed: SequentialServer, "
                    "MergedServer, PerClientServer")
  (g1,) = vjp_fn(g_acts)
  clients = jax.vmap(lambda c, g, s, a: c.step(tx, g, s, a))(clients, g1, new_stats, has)
  return clients, server, lsum


def visit_segment(setup, tx, clients: Portion, server, step: Step, order,
                  rule: SequentialServer, watch=None):
  """A :class:`SequentialServer` segment with every participant's part-1
  forward, backward and step inside the server's visit of it
  (``exec.client_pass = "per_visit"``).

  The values are those of the batched form (a participant's part-1 reads
  only its own portion, which no other visit changes), but one
  participant's part-1 activations are live at a time instead of every
  participant's through the whole segment: the peak memory of a segment no
  longer grows with the participants, and with seeds batched each kernel
  still sees seeds x batch samples.

  ``watch``: None, or ``(before, obs)``: ``obs = before(obs, clients, server,
  k, active)`` runs before participant ``k``'s visit (a watched round,
  :func:`watched_round`), and the final ``obs`` is returned last.

  Returns:
    ``(clients, server, loss_sum)`` (``+ (obs,)`` with ``watch``).
  """
  def visit(carry, k):
    stack, srv, obs = carry
    client = jax.tree.map(lambda a: a[k], stack)
    x, y, mask = step.x[k], step.y[k], step.mask[k]
    if watch is not None:
      obs = watch[0](obs, stack, srv, k, jnp.any(mask))

    def run():
      act, vjp_fn, ns = client_forward(setup, client, x, mask)
      new_srv, g_a, lsum = rule.step(srv, act, y, mask, k)
      (g1,) = vjp_fn(g_a)
      return client.step(tx, g1, ns, jnp.any(mask)), new_srv, lsum

    client, srv, lsum = lax.cond(jnp.any(mask), run,
                                 lambda: (client, srv, jnp.zeros((), jnp.float32)))
    stack = jax.tree.map(lambda a, v: a.at[k].set(v), stack, client)
    return (stack, srv, obs), lsum

  obs = None if watch is None else watch[1]
  (clients, server, obs), lsums = lax.scan(visit, (clients, server, obs), order,
                                           unroll=rule.unroll)
  if watch is None:
    return clients, server, jnp.sum(lsums)
  return clients, server, jnp.sum(lsums), obs


def serve_in_order(rule: SequentialServer, server, acts, y, mask, order):
  """A :class:`SequentialServer` over a segment: the carry visits the
  participants in ``order``, skipping those without a batch; the activation
  gradients come back in participant order."""
  def visit(srv, k):
    idle = lambda: (srv, jnp.zeros_like(acts[k]), jnp.zeros((), jnp.float32))
    srv, g_a, lsum = lax.cond(jnp.any(mask[k]),
                              lambda: rule.step(srv, acts[k], y[k], mask[k], k), idle)
    return srv, (g_a, lsum)

  server, (g_ordered, lsums) = lax.scan(visit, server, order, unroll=rule.unroll)
  return server, jnp.zeros_like(g_ordered).at[order].set(g_ordered), jnp.sum(lsums)


def serve_merged(rule: MergedServer, server, acts, y, mask):
  """A :class:`MergedServer` over a segment."""
  flat = lambda a: a.reshape((-1,) + a.shape[2:])
  server, g, lsum = rule.step(server, flat(acts), flat(y), flat(mask), None)
  g = g.reshape(acts.shape)
  if rule.per_client_mean:
    own = jnp.sum(mask, axis=1).astype(g.dtype)
    scale = jnp.sum(own) / jnp.maximum(own, 1.0)
    g = g * scale.reshape((-1,) + (1,) * (g.ndim - 1))
  return server, g, lsum


def per_client_segment(setup, tx, clients: Portion, server, step: Step,
                       rule: PerClientServer):
  """A segment under a :class:`PerClientServer`: every participant's piece,
  mapped over the participants (``client_exec``); with looped clients a
  participant without a batch skips its piece (``lax.cond``), which makes the
  padded steps of small Dirichlet clients free on the CPU.

  Returns:
    ``(clients, server, loss_sum)``.
  """
  n = step.mask.shape[0]
  inputs = jnp.arange(n)

  def piece_or_idle(client, srv, x, y, m, k):
    run = lambda: rule.piece(setup, tx, client, srv, x, y, m, k)
    if setup.client_exec == "vmap":
      return run()
    return lax.cond(jnp.any(m), run, lambda: (client, srv, jnp.zeros((), jnp.float32)))

  clients, server, lsums = map_clients(piece_or_idle, setup.client_exec, clients, server,
                                       step.x, step.y, step.mask, inputs)
  return clients, server, jnp.sum(lsums)


def metrics(out: SplitRound) -> dict:
  """The split family's metrics: mean loss, samples, and the participants in
  the first segment's serving order."""
  return round_metrics(out.plan, out.loss_sums, out.plan.clients[out.orders[0]])
