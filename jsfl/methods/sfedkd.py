"""SFedKD: Xu et al., "SFedKD: Sequential Federated Learning with
Discrepancy-Aware Multi-Teacher Knowledge Distillation" (docs/methods-sequential.md, whose
equations are reconstructed because the paper's text lost them).

FedSeq (``jsfl.methods.fedseq``) whose clients also distil from M teachers:
the models produced by the previous round's n clients (every client's model
after its turn), of which M are selected once per round.

Teacher selection (Sec. 3.3, Algorithm 1; ``selection``):

* ``greedy`` (default): S = {}; M times add the candidate k (not in S)
  minimising ``d(pi_bar_{S+k}, uniform)``, ``pi_bar`` the sample-weighted
  class distribution of the selected clients' data, ``d`` the
  ``selection_metric`` (KL by default, = log L - H(pi_bar)); ties go to the
  earlier candidate in the previous round's sequence.  Array ops: a
  ``lax.scan`` of M steps over all n candidates.
* ``random``: M distinct candidates uniformly at random (Table 3's baseline).

Loss of student client s (Eq. 3-5, 7): ``CE + alpha_t TCKD + beta_t NCKD``,

* ``TCKD = T^2 sum_k wTC_k KL(b^{T_k} || b^S)``: binary (target, non-target)
  probabilities at temperature T;
* ``NCKD = T^2 sum_k wNC_k KL(p~^{T_k} || p~^S)``: softmax at temperature T
  over the non-target classes;
* ``d_k = metric(pi_s, pi_k)`` between the student's and teacher k's client
  class distributions, each smoothed by adding ``smooth`` (1e-3) per class;
  ``metric`` in L1, L2 (Euclidean), KL(pi_s || pi_k) (default), JS;
* ``wNC_k = (d_k + eps) / sum_j (d_j + eps)`` (distant teachers know what the
  student lacks), ``wTC_k = (d_k + eps)^-1 / sum_j (d_j + eps)^-1`` (close
  teachers know what it learns); ``tc_weights`` / ``nc_weights = "equal"``
  replace either by 1/M (Table 2's ablation).

The paper gives no warm-up; DKD's reference code ramps its term over its
first 20 epochs.  ``kd_warmup = W`` (rounds) scales the distillation term
(DKD's or a baseline's) by ``min(r / W, 1)`` in the 0-based round r; the
default 0 applies it at full weight from round 1, the first with teachers.

Multi-teacher KD baselines (SFedKD Sec. 4.3.1, Table 2: "FedSeq + AVER /
EBKD / CA-MKD"; ``kd_loss``).  The ablation replaces SFedKD's KD method and
keeps its framework, so the baselines are this round with another loss term:
the same teachers (``selection``, ``num_teachers``; none in round 1), the
same cache, and student loss ``CE + kd_weight * KD`` with

  ``KD = T^2 mean_i sum_k w_{k,i} KL(p_{k,i} || q_i)``,

``p_{k,i}`` / ``q_i`` teacher k's / the student's softmax at temperature T on
sample i (plain KD, Hinton et al. 2015, per teacher), mean over the valid
samples, and per-sample teacher weights ``w_{k,i}`` (summing to 1 over k; no
gradient flows into them):

* ``aver``: You et al., "Learning from Multiple Teacher Networks", KDD 2017:
  ``w = 1/M``.  You et al. distil from the teachers' averaged soft labels
  ``p_bar``: ``KL(p_bar || q)`` differs from ``(1/M) sum_k KL(p_k || q)`` by a
  term of the teachers alone, so the student's gradients (and training) are
  the same; the logged ``reg_loss`` is the mean-of-KLs value.
* ``ebkd``: Kwon et al., "Adaptive Knowledge Distillation Based on Entropy",
  ICASSP 2020: ``w_k = (1 - H_k / sum_j H_j) / (M - 1)``, ``H_k`` the entropy
  of teacher k's softmax at T = 1 on the sample (confident teachers weigh
  more).
* ``camkd``: Zhang et al., "Confidence-Aware Multi-Teacher Knowledge
  Distillation", ICASSP 2022: ``w_k = (1 - softmax_k(CE_k)) / (M - 1)``,
  ``CE_k = -log softmax(z_k)[y]`` teacher k's cross-entropy on the sample's
  label at T = 1, the softmax over the teachers (teachers close to the
  one-hot label weigh more).

``M = 1`` gives ``w = 1`` under every rule.  Choices (docs/methods-sequential.md):
the weights are those of the CA-MKD authors' implementation of the three
methods, with EBKD's ``1 - H_k / sum_j H_j`` divided by ``M - 1`` so that
every rule's weights sum to 1 (that implementation divides every weighted
sum by M instead: EBKD there is ``(M - 1) / M`` and CA-MKD ``1 / M`` times the
term here, a factor of ``kd_weight``); logit distillation only: You et al.'s
intermediate-layer dissimilarity term and CA-MKD's intermediate-feature term
(learned adapters) are not implemented, nor any adaptive balance of the CE
and KD terms (the CE weight stays 1, as in that implementation).
``kd_weight = 1`` and T = 4 are the CA-MKD implementation's defaults; SFedKD
gives neither for its baselines, nor how they pick teachers (here SFedKD's
``selection`` and ``num_teachers``).  The DKD options (``alpha_t``, ``beta_t``, ``eps``,
``smooth``, ``metric``, ``tc_weights``, ``nc_weights``) do not enter these
terms.

Teachers are a stacked pytree with a leading teacher axis, evaluated in eval
mode on every student batch in one vmapped forward (``teacher_exec =
"vmap"``, the default off CPU) or unrolled over the teacher axis (the CPU
default; same values, and on the CPU the forms run level:
:func:`default_teacher_exec`).  With ``teacher_cache`` (default)
the teachers run once per student on its first epoch and later epochs look
the logits up by sample index (the teachers are frozen, so the values are
the same; E times fewer teacher forwards; not with ``method.drop_last``,
whose epochs each leave out another remainder).  Round 1 has no teachers (the KD terms
are multiplied by 0), and ``num_teachers = 0`` is FedSeq.  Every option is a
config key under ``[method]`` (see ``SFedKDOptions``), so the paper's ablations
(teacher number, random selection, equal weights, metric) are configs.

Logged per round (metrics): ``teachers`` (M,) client ids of the selected
teachers, ``teacher_pos`` (M,) their positions in the previous round's
sequence (both -1 in round 1), ``teacher_weights_tc`` / ``teacher_weights_nc``
(n, M): the weights of each student (rows in sequence order), and
``reg_loss`` (mean ``alpha_t TCKD + beta_t NCKD``, or ``kd_weight KD``).  The
weights are logged with ``kd_loss = "dkd"`` only (the baselines' are per
sample).

Departures from docs/methods-sequential.md: none in the math; the defaults alpha_t = 1,
beta_t = 8, T = 4 are the paper reading's (the paper's values are unknown).  The smoothed
distributions are renormalised to sum to 1.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core.clients import map_clients
from jsfl.core.data import gather
from jsfl.core.method import Method, label_rank_of, whole_model
from jsfl.core.plan import RoundPlan
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import parallel, sequential
from jsfl.options import option, option_set

_NEG = -1e9  # finite "minus infinity" for masked logits (no 0 * inf NaNs)


KD_METRICS = ("kl", "l1", "l2", "js")


KD_SELECTIONS = ("greedy", "random")


KD_WEIGHTINGS = ("discrepancy", "equal")


TEACHER_EXECS = ("auto", "vmap", "unroll", "map")


KD_LOSSES = ("dkd", "aver", "ebkd", "camkd")


# num_teachers <= clients_per_round is SFedKD's ``validate``'s.  Negative KD
# weights would push the student away from its teachers; T divides the
# logits; eps and smooth keep (d_k + eps)^-1 and KL(pi_s || pi_k) finite when
# d_k = 0 or a teacher lacks a class, so neither may be 0.
@option_set
class SFedKDOptions:
  num_teachers: int = option(5, "teachers M selected per round (0 = FedSeq)",
                             range="[0, 1000000]")
  alpha_t: float = option(1.0, "weight of the multi-teacher TCKD term",
                          range="[0, inf)", batchable=True)
  beta_t: float = option(8.0, "weight of the multi-teacher NCKD term",
                         range="[0, inf)", batchable=True)
  temperature: float = option(4.0, "distillation temperature T",
                              range="(0, inf)", batchable=True)
  eps: float = option(0.05, "smoothing constant of the teacher weights",
                      range="(0, inf)", batchable=True)
  smooth: float = option(1e-3, "added per class to client distributions for d_k",
                         range="(0, inf)", batchable=True)
  metric: str = option("kl", "discrepancy d_k between student and teacher data",
                       choices=KD_METRICS)
  selection: str = option("greedy", "teacher selection", choices=KD_SELECTIONS)
  selection_metric: str = option("kl", "distance of pi_bar to uniform in greedy selection",
                                 choices=KD_METRICS)
  tc_weights: str = option("discrepancy", "TCKD teacher weights", choices=KD_WEIGHTINGS)
  nc_weights: str = option("discrepancy", "NCKD teacher weights", choices=KD_WEIGHTINGS)
  kd_loss: str = option("dkd", "distillation term: dkd = SFedKD's discrepancy-weighted "
                        "multi-teacher DKD; aver / ebkd / camkd = plain KD from the same "
                        "teachers weighted equally / by entropy / by confidence (the "
                        "FedSeq + AVER / EBKD / CA-MKD baselines)", choices=KD_LOSSES)
  kd_weight: float = option(1.0, "weight of the KD term of kd_loss = aver / ebkd / camkd",
                            range="[0, inf)", batchable=True)
  kd_warmup: float = option(0.0, "rounds over which the distillation term ramps in: "
                            "weight min(r / kd_warmup, 1) in the 0-based round r (DKD's "
                            "warm-up, counted in rounds); 0 = full weight from the "
                            "first round with teachers", range="[0, inf)", batchable=True)
  teacher_exec: str = option("auto", "how the teachers' forward runs: one vmapped "
                             "forward over the stacked teachers, or unrolled; auto = "
                             "unroll on CPU, vmap elsewhere", choices=TEACHER_EXECS)
  teacher_cache: bool = option(True, "run the teachers once per client on its first "
                               "epoch and look their logits up in later epochs (same "
                               "values, E times fewer teacher forwards); not used with "
                               "method.drop_last, whose epochs hold different samples")


@struct.dataclass
class State:
  params: tuple
  stats: tuple
  prev_params: tuple     # (n, ...) every client's model of the previous round
  prev_stats: tuple
  prev_clients: jax.Array  # (n,) their client ids, in sequence order
  label_rank: jax.Array
  round: jax.Array


def validate(setup: Setup) -> None:
  """Checks ``num_teachers`` before anything is written (``Method.validate``)."""
  n, m = setup.clients_per_round, setup.options.num_teachers
  if not 0 <= m <= n:
    raise ValueError(f"method.num_teachers={m}; allowed: an int in "
                     f"[0, clients_per_round={n}]")


def init(setup: Setup, key) -> State:
  validate(setup)
  base = sequential.init_state(setup, key)
  n = setup.clients_per_round
  return State(base.params, base.stats, broadcast(base.params, n),
               broadcast(base.stats, n), jnp.zeros((n,), jnp.int32),
               base.label_rank, base.round)


# ------------------------------------------------------------ distributions
def distance(p, q, metric: str):
  """Distance between distributions along the last axis.

  Args:
    p, q: ``(..., L)`` probability vectors (broadcastable).
    metric: ``kl`` (KL(p || q), ``0 log 0 = 0``), ``l1``, ``l2`` (Euclidean)
      or ``js`` (Jensen-Shannon, natural log).

  Returns:
    ``(...)`` distances.
  """
  if metric == "l1":
    return jnp.sum(jnp.abs(p - q), axis=-1)
  if metric == "l2":
    return jnp.sqrt(jnp.sum((p - q) ** 2, axis=-1))
  if metric == "kl":
    return jnp.sum(_kl_terms(p, q), axis=-1)
  if metric == "js":
    mid = 0.5 * (p + q)
    return 0.5 * jnp.sum(_kl_terms(p, mid) + _kl_terms(q, mid), axis=-1)
  raise ValueError(f"metric={metric!r}; allowed: {KD_METRICS}")


def _kl_terms(p, q):
  # xlogy gives 0 where p == 0; q is positive wherever p is in our uses.
  return jax.scipy.special.xlogy(p, p) - jax.scipy.special.xlogy(p, q)


def normalize_counts(counts):
  """Class counts -> distributions (all-zero rows stay zero)."""
  counts = counts.astype(jnp.float32)
  return counts / jnp.maximum(jnp.sum(counts, axis=-1, keepdims=True), 1e-12)


def smoothed(counts, smooth: float):
  """Class distribution with ``smooth`` added per class, renormalised."""
  p = normalize_counts(counts) + smooth
  return p / jnp.sum(p, axis=-1, keepdims=True)


# -------------------------------------------------------- teacher selection
def greedy_select(cand_counts, num: int, metric: str = "kl"):
  """Greedy complementary teacher selection (Algorithm 1).

  Args:
    cand_counts: ``(n, L)`` class counts of the candidates' clients.
    num: teachers M (static, ``1 <= M <= n``).
    metric: distance of the pooled distribution to uniform.

  Returns:
    ``(M,)`` int32 candidate positions, in the order they were picked.
  """
  n, num_classes = cand_counts.shape
  counts = cand_counts.astype(jnp.float32)
  uniform = jnp.full((num_classes,), 1.0 / num_classes)

  def pick(carry, _):
    pooled, chosen = carry
    d = distance(normalize_counts(pooled[None] + counts), uniform, metric)
    k = jnp.argmin(jnp.where(chosen, jnp.inf, d))
    return (pooled + counts[k], chosen.at[k].set(True)), k.astype(jnp.int32)

  _, sel = lax.scan(pick, (jnp.zeros((num_classes,)), jnp.zeros((n,), bool)),
                    None, length=num)
  return sel


def random_select(key, n: int, num: int):
  """``num`` distinct candidate positions uniformly at random."""
  return jax.random.choice(key, n, (num,), replace=False).astype(jnp.int32)


def teacher_weights(student_counts, teacher_counts, *, metric="kl", eps=0.05,
                    smooth=1e-3, tc="discrepancy", nc="discrepancy"):
  """Discrepancy-aware TCKD / NCKD weights of every student (Eq. 5).

  Args:
    student_counts: ``(S, L)`` class counts of the students' clients.
    teacher_counts: ``(M, L)`` class counts of the teachers' clients.
    metric: ``d_k`` metric (see :func:`distance`).
    eps: smoothing constant of the weights.
    smooth: added per class to both distributions before ``d_k``.
    tc, nc: ``"discrepancy"`` or ``"equal"`` (1/M).

  Returns:
    ``(w_tc, w_nc)``, each ``(S, M)`` with rows summing to 1.
  """
  ps = smoothed(student_counts, smooth)[:, None, :]
  pt = smoothed(teacher_counts, smooth)[None, :, :]
  d = distance(ps, pt, metric) + eps                       # (S, M)
  equal = jnp.full(d.shape, 1.0 / d.shape[1])
  w_nc = d / jnp.sum(d, axis=1, keepdims=True)
  w_tc = (1.0 / d) / jnp.sum(1.0 / d, axis=1, keepdims=True)
  for name, v in (("tc_weights", tc), ("nc_weights", nc)):
    if v not in KD_WEIGHTINGS:
      raise ValueError(f"{name}={v!r}; allowed: {KD_WEIGHTINGS}")
  return (equal if tc == "equal" else w_tc), (equal if nc == "equal" else w_nc)


# ------------------------------------------------------- multi-teacher DKD
def dkd_terms(student_logits, teacher_logits, labels, temperature):
  """Per-teacher, per-sample decoupled KD terms (Zhao et al., CVPR 2022).

  Args:
    student_logits: ``(B, L)``.
    teacher_logits: ``(M, B, L)``; no gradient flows into them.
    labels: ``(B,)`` target classes.
    temperature: T.

  Returns:
    ``(tckd, nckd)``, each ``(M, B)``: ``KL(b^T || b^S)`` over the binary
    (target, non-target) probabilities and ``KL(p~^T || p~^S)`` over the
    non-target classes, both at temperature T, without the ``T^2`` factor.
  """
  t = temperature
  teacher_logits = lax.stop_gradient(teacher_logits)
  target = jax.nn.one_hot(labels, student_logits.shape[-1], dtype=bool)

  def binary_log_probs(z):
    # log p(target), log p(non-target) from log-sum-exps: no log(1 - p).
    z = z / t
    lse = jax.nn.logsumexp(z, axis=-1)
    lt = jnp.sum(jnp.where(target, z, 0.0), axis=-1) - lse
    lnt = jax.nn.logsumexp(jnp.where(target, _NEG, z), axis=-1) - lse
    return jnp.stack([lt, lnt], axis=-1)

  def non_target_log_probs(z):
    return jax.nn.log_softmax(jnp.where(target, _NEG, z / t), axis=-1)

  bs, bt = binary_log_probs(student_logits), binary_log_probs(teacher_logits)
  tckd = jnp.sum(jnp.exp(bt) * (bt - bs[None]), axis=-1)
  ns, nt = non_target_log_probs(student_logits), non_target_log_probs(teacher_logits)
  nckd = jnp.sum(jnp.where(target, 0.0, jnp.exp(nt) * (nt - ns[None])), axis=-1)
  return tckd, nckd


def multi_teacher_dkd(student_logits, teacher_logits, labels, mask, w_tc, w_nc,
                      temperature):
  """The multi-teacher TCKD and NCKD losses (Eq. 3-4), batch means.

  Args:
    student_logits: ``(B, L)``.
    teacher_logits: ``(M, B, L)``.
    labels: ``(B,)``.
    mask: ``(B,)`` valid samples.
    w_tc, w_nc: ``(M,)`` teacher weights.
    temperature: T.

  Returns:
    ``(TCKD, NCKD)``: ``T^2 sum_k w_k mean_i KL_{k,i}`` over valid samples.
  """
  tckd, nckd = dkd_terms(student_logits, teacher_logits, labels, temperature)
  m = mask.astype(jnp.float32)
  denom = jnp.maximum(jnp.sum(m), 1.0)
  scale = temperature ** 2
  return (scale * jnp.sum(w_tc[:, None] * tckd * m) / denom,
          scale * jnp.sum(w_nc[:, None] * nckd * m) / denom)


# ------------------------------------------- multi-teacher KD baselines
def kd_terms(student_logits, teacher_logits, temperature):
  """Per-teacher, per-sample KD terms ``KL(p_k || q)`` at temperature T
  (without ``T^2``), ``(M, B)``; no gradient flows into the teachers."""
  t = temperature
  lt = jax.nn.log_softmax(lax.stop_gradient(teacher_logits) / t, axis=-1)
  ls = jax.nn.log_softmax(student_logits / t, axis=-1)
  return jnp.sum(jnp.exp(lt) * (lt - ls[None]), axis=-1)


def kd_teacher_weights(teacher_logits, labels, rule: str):
  """Per-sample teacher weights of the KD baselines (module docstring).

  Args:
    teacher_logits: ``(M, B, L)``.
    labels: ``(B,)`` (read by ``camkd``).
    rule: ``aver``, ``ebkd`` or ``camkd``.

  Returns:
    ``(M, B)`` weights, each column summing to 1, without gradient.
  """
  z = lax.stop_gradient(teacher_logits)
  m = z.shape[0]
  if rule not in KD_LOSSES[1:]:
    raise ValueError(f"rule={rule!r}; allowed: {KD_LOSSES[1:]}")
  if rule == "aver" or m == 1:
    return jnp.full(z.shape[:2], 1.0 / m, z.dtype)
  logp = jax.nn.log_softmax(z, axis=-1)                     # T = 1
  if rule == "ebkd":
    h = -jnp.sum(jnp.exp(logp) * logp, axis=-1)             # (M, B) entropies
    total = jnp.sum(h, axis=0, keepdims=True)
    # Every teacher one-hot (all H = 0): equal shares, w = 1/M.
    share = jnp.where(total > 0, h / jnp.where(total > 0, total, 1.0), 1.0 / m)
    return (1.0 - share) / (m - 1)
  ce = -jnp.take_along_axis(logp, labels[None, :, None], axis=-1)[..., 0]   # (M, B)
  return (1.0 - jax.nn.softmax(ce, axis=0)) / (m - 1)


def multi_teacher_kd(student_logits, teacher_logits, labels, mask, rule: str,
                     temperature):
  """A KD baseline's loss ``T^2 mean_i sum_k w_{k,i} KL(p_{k,i} || q_i)``
  over the valid samples (``mask``), weights by :func:`kd_teacher_weights`."""
  kl = kd_terms(student_logits, teacher_logits, temperature)
  w = kd_teacher_weights(teacher_logits, labels, rule)
  m = mask.astype(jnp.float32)
  return temperature ** 2 * jnp.sum(w * kl * m) / jnp.maximum(jnp.sum(m), 1.0)


def default_teacher_exec(backend: str | None = None) -> str:
  """The teachers' loop ``teacher_exec = "auto"`` resolves to: one teacher
  after another on the CPU, one vmapped forward elsewhere.  On the CPU,
  whose convolutions lower to matmuls (im2col), the three forms run level:
  the teachers' forward within the machine's noise of each other on
  LeNet-5, AlexNet and the small CNN (``benchmarks/teacher_exec.py``), the
  whole LeNet-5 SFedKD round too, with the same records
  (``benchmarks/README.md``); a vmap over stacked conv weights is the
  batched form accelerators are built for (not measured on one yet)."""
  return "unroll" if (backend or jax.default_backend()) == "cpu" else "vmap"


def teacher_logits(setup: Setup, t_params, t_stats, x, how: str = "vmap"):
  """All teachers' eval-mode logits on one batch, ``(M, B, L)``.

  ``how="vmap"`` is one vmapped forward over the stacked teachers;
  ``"unroll"`` / ``"map"`` run them one after another in the same program
  (same values; ``"auto"``: :func:`default_teacher_exec`).
  """
  if how == "auto":
    how = default_teacher_exec()
  return map_clients(lambda p, s: setup.model.apply(p, s, x, train=False)[0], how,
                     t_params, t_stats)


def epoch_teacher_logits(setup: Setup, data, t_params, t_stats, idx, mask,
                         how: str = "vmap"):
  """The teachers' logits on one epoch of one client's batches (the cache).

  One epoch holds every sample of the client exactly once, so later epochs'
  batches (other permutations of the same samples) look their teacher
  logits up here instead of running the teachers again: the teachers are
  frozen and in eval mode, so the values are the same.

  Args:
    setup: static run description.
    data: device data.
    t_params, t_stats: stacked teachers (leading axis M).
    idx, mask: ``(nb, B)`` the client's first-epoch batches.
    how: see :func:`teacher_logits`.

  Returns:
    ``(ids, valid, logits)``: ``(nb*B,)`` sample indices, ``(nb*B,)`` their
    validity and ``(M, nb*B, L)`` the teachers' logits.
  """
  num_t = jax.tree.leaves(t_params)[0].shape[0]
  shape = (num_t, idx.shape[1], setup.num_classes)

  def one(a):
    i, m = a
    # Padding batches (small clients) are skipped: a cond, not a select, where
    # the seed axis is a rolled map (the CPU default).
    return lax.cond(jnp.any(m),
                    lambda: teacher_logits(setup, t_params, t_stats,
                                           gather(data, i)[0], how),
                    lambda: jnp.zeros(shape, jnp.float32))

  logits = lax.map(one, (idx, mask))                       # (nb, M, B, L)
  logits = jnp.moveaxis(logits, 1, 0).reshape(num_t, -1, setup.num_classes)
  return idx.reshape(-1), mask.reshape(-1), logits


def lookup_logits(ids, valid, logits, idx):
  """The cached ``(M, B, L)`` teacher logits of the samples ``idx`` (B,)."""
  hit = (idx[:, None] == ids[None, :]) & valid[None, :]
  return logits[:, jnp.argmax(hit, axis=1)]


# -------------------------------------------------------------------- round
def select(setup: Setup, state: State, data, key):
  """This round's teachers: positions into the previous round's sequence."""
  o = setup.options
  n = setup.clients_per_round
  if o.selection == "random":
    return random_select(key, n, o.num_teachers)
  if o.selection != "greedy":
    raise ValueError(f"selection={o.selection!r}; allowed: {KD_SELECTIONS}")
  return greedy_select(data.counts[state.prev_clients], o.num_teachers,
                       o.selection_metric)


class Teachers(NamedTuple):
  """What SFedKD's planner hands its hooks: the round's teachers (positions
  into the previous round's sequence, their models), whether there are any
  yet (round 0 has none) and the round's data (client label counts, the
  cache's batches)."""

  pos: jax.Array | None
  params: Any
  stats: Any
  on: jax.Array | None
  data: Any
  ramp: jax.Array | None = None  # the distillation term's weight (kd_warmup)


def plan(setup: Setup, state: State, data, key) -> RoundPlan:
  """FedSeq's plan with the round's teachers as its context."""
  p = sequential.plan_at_round(setup, state, data, key)
  if setup.options.num_teachers == 0:
    return p._replace(context=Teachers(None, None, None, None, data))
  pos = select(setup, state, data, jax.random.fold_in(key, 0x5EDCD))
  on = (state.round > 0).astype(jnp.float32)
  return p._replace(context=Teachers(
      pos, jax.tree.map(lambda a: a[pos], state.prev_params),
      jax.tree.map(lambda a: a[pos], state.prev_stats), on, data,
      on * warmup_weight(p.options.kd_warmup, state.round)))


def warmup_weight(warmup, round_idx):
  """``min(r / warmup, 1)`` in the 0-based round r, 1 without a warm-up:
  mdistiller's DKD ramps its term over its first 20 epochs the same way."""
  r = jnp.asarray(round_idx, jnp.float32)
  return jnp.where(warmup > 0, jnp.minimum(r / jnp.maximum(warmup, 1e-12), 1.0), 1.0)


def uses_cache(setup: Setup) -> bool:
  """Whether the round caches the teachers' first-epoch logits: with
  ``teacher_cache``, unless ``drop_last`` leaves a different remainder out
  of every epoch (a later epoch's sample may have no cached logits)."""
  return bool(setup.options.teacher_cache) and not setup.drop_last


def client_context(setup: Setup):
  """Per student (sequence order): its TCKD and NCKD teacher weights (None
  under a KD baseline, whose weights are per sample) and, with
  ``teacher_cache``, the teachers' logits on its first epoch."""
  cache = uses_cache(setup)
  def context(state: State, plan: RoundPlan, seq):
    o, t = plan.options, plan.context
    w_tc = w_nc = None
    if setup.options.kd_loss == "dkd":
      students = plan.clients[seq]
      w_tc, w_nc = teacher_weights(
          t.data.counts[students], t.data.counts[state.prev_clients[t.pos]],
          metric=o.metric, eps=o.eps, smooth=o.smooth, tc=o.tc_weights, nc=o.nc_weights)
    cached = None
    if cache:
      nb = plan.idx.shape[0] // setup.local_epochs
      ep_idx = jnp.swapaxes(plan.idx[:nb, seq], 0, 1)      # (n, nb, B)
      ep_mask = jnp.swapaxes(plan.mask[:nb, seq], 0, 1)
      cached = lax.map(lambda a: epoch_teacher_logits(
          setup, t.data, t.params, t.stats, a[0], a[1], o.teacher_exec), (ep_idx, ep_mask))
    return w_tc, w_nc, cached
  return context


def client_term(setup: Setup):
  """The multi-teacher DKD loss of a student's batch, or the ``kd_loss``
  baseline's KD loss (0 before the first round has trained any teacher)."""
  rule = setup.options.kd_loss
  if rule not in KD_LOSSES:
    raise ValueError(f"kd_loss={rule!r}; allowed: {KD_LOSSES}")
  cache = uses_cache(setup)

  def term(plan: RoundPlan, p, batch, client):
    o, t = plan.options, plan.context
    wtc, wnc, cached = client.ctx
    if cache:
      ids, valid, logits = cached
      tl = lookup_logits(ids, valid, logits, batch.idx)
    else:
      tl = teacher_logits(setup, t.params, t.stats, batch.x, o.teacher_exec)
    if rule != "dkd":
      return t.ramp * o.kd_weight * multi_teacher_kd(batch.logits, tl, batch.y, batch.mask,
                                                     rule, o.temperature)
    tckd, nckd = multi_teacher_dkd(batch.logits, tl, batch.y, batch.mask,
                                   wtc, wnc, o.temperature)
    return t.ramp * (o.alpha_t * tckd + o.beta_t * nckd)
  return term


def finish(setup: Setup, state: State, out: sequential.SequenceRound):
  """The last student's model, every student's model as the next round's
  candidate teachers; the logged keys of the module docstring."""
  students = out.plan.clients[out.seq]
  metrics = sequential.sequence_metrics(out.plan, out.seq, out.sums)
  if setup.options.num_teachers > 0:
    prev_params, prev_stats = out.models
    t = out.plan.context
    w_tc, w_nc, _ = out.context
    metrics.update(teachers=jnp.where(t.on > 0, state.prev_clients[t.pos], -1),
                   teacher_pos=jnp.where(t.on > 0, t.pos, -1))
    # the round's own traffic: round 1 sends no teachers
    up, down = round_bytes(setup, t.on)
    metrics.update(bytes_up=jnp.asarray(up, jnp.float32), bytes_down=down)
    if w_tc is not None:
      metrics.update(teacher_weights_tc=w_tc * t.on, teacher_weights_nc=w_nc * t.on)
  else:  # nothing will read them
    prev_params, prev_stats = state.prev_params, state.prev_stats
  new = State(out.params, out.stats, prev_params, prev_stats, students.astype(jnp.int32),
              state.label_rank, state.round + 1)
  return new, metrics


def build(setup: Setup) -> sequential.SequentialRounds:
  """SFedKD for a run (options: ``SFedKDOptions``): FedSeq with the
  multi-teacher DKD term (or a ``kd_loss`` baseline's KD term);
  ``num_teachers = 0`` is FedSeq."""
  if setup.options.num_teachers == 0:
    alg = sequential.SequentialAlgorithm(plan=plan)
  else:
    alg = sequential.SequentialAlgorithm(
        plan=plan, client_term=client_term(setup), client_context=client_context(setup),
        keep_models=True)
  return sequential.SequentialRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One SFedKD round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = whole_model


def round_bytes(setup: Setup, teachers_on=1):
  """FedSeq's traffic plus, with teachers (``teachers_on``, 0 in round 1),
  M teacher models down to every participant: ``(up, down)``."""
  b = parallel.model_bytes(setup)
  n, m = setup.clients_per_round, setup.options.num_teachers
  return n * b, n * (1 + teachers_on * m) * b


def communication(setup: Setup, samples: int):
  """A round's traffic once there are teachers (round 2 on; a round's
  metrics hold its own count, without them in round 1)."""
  return round_bytes(setup)


METHOD = Method(build, output_model, communication, validate=validate,
                label_rank=label_rank_of,
                options=SFedKDOptions)
