"""MultiSFL (KoReA-SFL) and the SFL-form FedNTD / FedExp / FedMut.

* Eqs. 2-6 (score vectors, priorities, quotas, FGN, adaptive proportion)
  against hand-computed cases.
* The replay sampler against its contract: never an active client, never
  more than the quota or an assistant's holdings, the quota filled whenever
  the inactive clients hold enough, every replay sample used once per epoch.
* A MultiSFL round against a plain Python loop of the same math (per branch,
  per step, jitted per-piece calls, hand-written SGD, replay features from
  the frozen copy on the valid replay samples only, master aggregation and
  pull-back, the proportion update); the sample choices (main clients,
  batches, replay indices) come from ``multisfl.decide``, which the round
  itself calls, while the loop recomputes scores and quotas itself.
* The SFL-form baselines against a loop SFL reference with the changed piece
  (server loss, aggregation, starting models) written as loops.
* CLI smoke runs of the four methods on synthetic data; shapes of the new
  models.
"""

import dataclasses
import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_fed_data
from loop_reference import (
  TOL,
  RefServer,
  make_setup,
  ref_avg,
  ref_bwd,
  ref_fwd,
  ref_grad,
  ref_sgd,
  ref_split,
  tiny_model,
  zeros_like,
)

from jsfl import cli
from jsfl.core.data import gather
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import activation_size, portion_bytes
from jsfl.methods import fedntd, multisfl, sfl_fedexp, sfl_fedmut, sfl_fedntd
from jsfl.methods.catalog import get_method
from jsfl.methods.multisfl import MultiSFLOptions
from jsfl.models import get_model
from jsfl.models import mobilenet_v2 as _mnv2  # noqa: F401  (registers)
from jsfl.models import vgg16 as _vgg16  # noqa: F401  (registers)
from jsfl.rundir import read_metrics


def take(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


# ------------------------------------------------------------ Eqs. 2-6
def test_score_vector_priorities_and_quotas_hand_cases():
  num, den = jnp.zeros((1, 3)), jnp.zeros(())
  num, den, sv = multisfl.update_scores(num, den, jnp.array([[4, 0, 2]]), 0.5)
  np.testing.assert_allclose(sv, [[4, 0, 2]])
  num, den, sv = multisfl.update_scores(num, den, jnp.array([[0, 2, 2]]), 0.5)
  # (0.5 [4,0,2] + [0,2,2]) / (0.5 + 1)
  np.testing.assert_allclose(den, 1.5)
  np.testing.assert_allclose(sv, [[4 / 3, 4 / 3, 2]], rtol=1e-6)
  np.testing.assert_allclose(multisfl.priorities(jnp.array([1.0, 2, 3, 6])), [2, 1, 0, 0])
  # |D| p = 10 split 2:1 -> 6.67, 3.33 -> floors
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([1.0, 2, 3, 6]), jnp.int32(50), 0.2), [6, 3, 0, 0])
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([2.0, 2, 2]), jnp.int32(50), 0.5), [0, 0, 0])
  np.testing.assert_array_equal(
      # mean 3 -> priors (3, 0, 0, 1); 10 split 3:1 -> 7.5, 2.5
      multisfl.quotas(jnp.array([0.0, 5, 5, 2]), jnp.int32(40), 0.25), [7, 0, 0, 2])
  # min_request: |D| p = 0.5 is raised to 10, split 2:1 -> 6.67, 3.33; a
  # request already above the floor is left as it is
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([1.0, 2, 3, 6]), jnp.int32(50), 0.01, 10), [6, 3, 0, 0])
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([1.0, 2, 3, 6]), jnp.int32(50), 0.01), [0, 0, 0, 0])
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([1.0, 2, 3, 6]), jnp.int32(50), 0.6, 10), [20, 10, 0, 0])
  np.testing.assert_array_equal(
      multisfl.quotas(jnp.array([2.0, 2, 2]), jnp.int32(50), 0.01, 10), [0, 0, 0])


def test_fgn_and_proportion_hand_cases():
  grads = {"w": jnp.array([[3.0, 4.0], [2.0, 0.0]])}  # summed over 1 and 2 steps
  # branch 0: ||(3,4)||^2 = 25; branch 1: ||(1,0)||^2 = 1
  np.testing.assert_allclose(multisfl.fgn(grads, jnp.array([1, 2]), 0.1), -1.3, rtol=1e-6)
  nxt = lambda p, now, prev, has=True: float(multisfl.next_proportion(
      jnp.float32(p), jnp.float32(now), jnp.float32(prev), jnp.bool_(has), 0.01, 0.5))
  assert nxt(0.1, -1.0, -2.0) == pytest.approx(0.15)      # 0.1 * (1 + 1/2)
  assert nxt(0.1, -3.0, -2.0) == pytest.approx(0.05)      # 0.1 * (1 - 1/2)
  assert nxt(0.1, -9.0, -2.0) == pytest.approx(0.01)      # clipped below
  assert nxt(0.4, -0.1, -2.0) == pytest.approx(0.5)       # clipped above
  assert nxt(0.1, -1.0, -2.0, has=False) == pytest.approx(0.1)  # round 0
  assert nxt(0.1, -1.0, 0.0) == pytest.approx(0.1)        # FGN(r-1) = 0


# ---------------------------------------------------------------- sampler
K_S, L_S, N_S = 12, 5, 4


def test_authors_proportion_rules_hand_cases():
  clp = lambda p, d: float(multisfl.clp_proportion(jnp.float32(p), d, 0.01, 0.2, 0.01))
  seq, p = [], 0.01
  for _ in range(8):  # a critical period throughout: doubling, then +0.01
    p = clp(p, 1.0)
    seq.append(p)
  np.testing.assert_allclose(seq, [0.02, 0.04, 0.08, 0.16, 0.2, 0.21, 0.22, 0.23], rtol=1e-6)
  np.testing.assert_allclose([clp(0.16, 0.0), clp(0.03, -0.5), clp(0.012, -1.0)],
                             [0.08, 0.015, 0.01], rtol=1e-6)  # halved to the floor
  hist = jnp.zeros(11)
  for g in (1.0, 2.0):  # the zero padding: every early round is critical
    hist = multisfl.push_signal(hist, jnp.float32(g))
    assert float(multisfl.windowed_change(hist)) > 0
  full = jnp.arange(1.0, 12.0)  # newest 11 > oldest 1: (mean 2..11 - mean 1..10) / mean 1..10
  np.testing.assert_allclose(multisfl.windowed_change(full), 1.0 / 5.5, rtol=1e-6)
  assert float(multisfl.windowed_change(full.at[-1].set(0.5))) < 0
  rel = lambda p, d, r: float(multisfl.relative_proportion(
      jnp.float32(p), jnp.float32(d), jnp.int32(r), 0.01, 0.05))
  assert rel(0.1, 0.5, 0) == pytest.approx(0.1)        # round 0: unchanged
  assert rel(0.1, 0.5, 3) == pytest.approx(0.15)
  assert rel(0.02, -0.9, 3) == pytest.approx(0.01)     # floor 0.01 up to round 10
  assert rel(0.02, -0.9, 11) == pytest.approx(0.05)    # then 0.05


def test_authors_helper_batches_hand_case():
  """Q = 7 replay samples over nb = 3 main batches (size 25, B 10): h = 3,
  batches 0 and 1 get 3, batch 2 gets 1, every epoch from a fresh shuffle."""
  idx = jnp.arange(100, 110)
  valid = jnp.arange(10) < 7
  got, mask = multisfl.authors_shares(jax.random.key(0), idx, valid, jnp.int32(25), 10,
                                      epochs=2, steps=4, per_step=5)
  got, mask = np.asarray(got), np.asarray(mask)
  assert got.shape == (8, 5)
  assert mask.sum(1).tolist() == [3, 3, 1, 0, 3, 3, 1, 0]
  for t in range(8):
    share = got[t][mask[t]]
    assert len(set(share.tolist())) == len(share) and set(share) <= set(range(100, 107))
  shuffles = {tuple(got[t][mask[t]]) for t in range(8) if mask[t].any()}
  assert len(shuffles) > 2   # fresh draws, not one slicing repeated


def test_authors_communication_accounting_hand_case():
  setup = ms_setup("authors-E2")  # n = 3 branches, E = 2, min_request = L = 4
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  # |D_i| p = 13 * 0.3 = 3.9 -> max(4, 3), 20 * 0.3 = 6, 5 * 0.3 = 1.5 -> 4: 14 requested
  up, down = multisfl.authors_round_bytes(setup, 76, jnp.array([13, 20, 5]),
                                          jnp.float32(0.3), 5)
  assert float(up) == pytest.approx(3 * p1 + 76 * act + 14 * 2 * act)
  assert float(down) == pytest.approx(3 * p1 + 76 * act + 5 * 2 * p1)


def test_authors_score_recursion_and_rounding_hand_cases():
  sv, w = jnp.zeros(3), jnp.float32(0.0)
  sv, w, _ = multisfl.update_scores_authors(sv, w, jnp.array([4, 0, 2]), 0.5)
  np.testing.assert_allclose(sv, [4, 0, 2])
  np.testing.assert_allclose(w, 1.0)
  sv, w, _ = multisfl.update_scores_authors(sv, w, jnp.array([0, 2, 2]), 0.5)
  np.testing.assert_allclose(sv, np.array([2, 2, 3]) / 1.5, rtol=1e-6)
  np.testing.assert_allclose(w, 1.5)
  sv, w, _ = multisfl.update_scores_authors(sv, w, jnp.array([0, 0, 0]), 0.5)
  # the normalised score is decayed again: (0.5 [2, 2, 3] / 1.5) / 1.75, where
  # Eq. 2 gives (0.25 [4, 0, 2] + 0.5 [0, 2, 2]) / 1.75
  np.testing.assert_allclose(sv, np.array([2, 2, 3]) * 0.5 / 1.5 / 1.75, rtol=1e-6)
  np.testing.assert_allclose(w, 1.75)
  # priors [3, 1, 0, 0] (shares 0.75, 0.25); |D| p = 107 * 0.1 = 10.7
  q = lambda p, m, rounding: np.asarray(multisfl.quotas(
      jnp.array([0.0, 2, 4, 6]), jnp.int32(107), p, m, rounding)).tolist()
  assert q(0.1, 0, "spec") == [8, 2, 0, 0]      # floor(8.025), floor(2.675)
  assert q(0.1, 0, "authors") == [7, 2, 0, 0]   # int(10.7) = 10 first: 7.5, 2.5
  assert q(0.01, 4, "authors") == [3, 1, 0, 0]  # max(L = 4, int(1.07))
  assert q(0.01, 0, "spec") == [0, 0, 0, 0]


def _sampler_case(seed):
  """Random holdings (some classes scarce), active clients and quotas."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(3, 15, K_S)
  y = np.concatenate([rng.choice(L_S, s, p=[0.4, 0.3, 0.2, 0.08, 0.02])
                      for s in sizes]).astype(np.int32)
  y = np.pad(y, (0, K_S * 15 - len(y)))   # one length: one compile
  table = np.zeros((K_S, 15), np.int32)   # one width: one compile
  start = 0
  for k, s in enumerate(sizes):
    table[k, :s] = np.arange(start, start + s)
    start += s
  active = np.zeros(K_S, bool)
  active[rng.choice(K_S, N_S, replace=False)] = True
  quota = rng.integers(0, 12, (N_S, L_S)).astype(np.int32)
  return table, sizes.astype(np.int32), y, active, quota


@functools.partial(jax.jit, static_argnums=(5,))
def _sample(key, table, sizes, y, active, cap, quota):
  k_pool, k_take, k_slots = jax.random.split(key, 3)
  hold = multisfl.client_holdings(table, sizes, y, L_S)
  pool, start = multisfl.class_pool(k_pool, table, sizes, y, L_S)
  take = jax.vmap(lambda k, q: multisfl.assistant_takes(k, hold, active, q))(
      jax.random.split(k_take, N_S), quota)
  idx, valid = jax.vmap(lambda k, t: multisfl.replay_slots(k, t, pool, start, hold, cap))(
      jax.random.split(k_slots, N_S), take)
  return hold, take, idx, valid


@pytest.mark.parametrize("seed", range(4))
def test_replay_sampler_contract(seed):
  table, sizes, y, active, quota = _sampler_case(seed)
  owner = np.full(len(y), -1)
  for k in range(K_S):
    owner[table[k, :sizes[k]]] = k
  hold, tk, idx, valid = map(np.asarray, _sample(
      jax.random.key(seed), jnp.asarray(table), jnp.asarray(sizes), jnp.asarray(y),
      jnp.asarray(active), 64, jnp.asarray(quota)))
  want_hold = np.stack([np.bincount(y[table[k, :sizes[k]]], minlength=L_S)
                        for k in range(K_S)])
  np.testing.assert_array_equal(hold, want_hold)
  inactive_hold = want_hold[~active].sum(0)
  for i in range(N_S):
    assert not tk[i][active].any()                      # never an active client
    assert (tk[i] <= want_hold).all()                   # never beyond holdings
    served = tk[i].sum(0)
    assert (served <= quota[i]).all()                   # never beyond the quota
    np.testing.assert_array_equal(served, np.minimum(quota[i], inactive_hold))
    chosen = idx[i][valid[i]]
    assert valid[i].sum() == served.sum() and not valid[i][served.sum():].any()
    assert len(set(chosen.tolist())) == len(chosen)     # no sample twice
    got = np.zeros((K_S, L_S), int)
    np.add.at(got, (owner[chosen], y[chosen]), 1)
    np.testing.assert_array_equal(got, tk[i])           # the takes, exactly
  # some classes were short: the case covers both "filled" and "exhausted"
  assert (quota.sum(0) > inactive_hold).any() or seed > 0


def test_assistants_are_visited_in_random_order():
  """With a quota one client can fill, different keys pick different assistants."""
  hold = jnp.full((6, 2), 5, jnp.int32)
  active = jnp.array([True, False, False, False, False, False])
  firsts = {int(np.flatnonzero(np.asarray(multisfl.assistant_takes(
      jax.random.key(s), hold, active, jnp.array([3, 0])))[:, 0])[0]) for s in range(20)}
  assert 0 not in firsts and len(firsts) >= 3


def test_step_shares_use_every_replay_sample_once():
  idx = jnp.arange(100, 113)
  valid = jnp.arange(13) < 11
  # main client of 18 samples, B = 4 -> 5 batches; 11 replay samples
  sidx, smask = multisfl.step_shares(idx, valid, jnp.int32(18), 4, 7, 3)
  sidx, smask = np.asarray(sidx), np.asarray(smask)
  assert sorted(sidx[smask].tolist()) == list(range(100, 111))
  np.testing.assert_array_equal(smask.sum(1), [2, 2, 2, 2, 3, 0, 0])
  assert not smask[5:].any()


@pytest.mark.parametrize("schedule", ["even", "authors"])
def test_replay_shares_skip_the_batch_drop_last_leaves_out(schedule):
  """With ``method.drop_last`` a main client of 18 samples at B = 4 has 4
  batches, not 5: the replay list of 10 goes to those 4 (a share on the
  dropped fifth would be counted but never trained), and a client smaller
  than B, with no batch, gets none."""
  idx, valid = jnp.arange(100, 113), jnp.arange(13) < 10

  def shares(size, drop_last):
    if schedule == "even":
      return multisfl.step_shares(idx, valid, jnp.int32(size), 4, 7, 3, drop_last)[1]
    return multisfl.authors_shares(jax.random.key(0), idx, valid, jnp.int32(size), 4,
                                   epochs=1, steps=7, per_step=3, drop_last=drop_last)[1]

  kept, dropped = np.asarray(shares(18, False)), np.asarray(shares(18, True))
  assert kept.sum(1).tolist() == [2, 2, 2, 2, 2, 0, 0]
  # even: floor(b Q / 4) -> 2, 3, 2, 3; authors: h = ceil(10 / 4) = 3 -> 3, 3, 3, 1
  want = [2, 3, 2, 3] if schedule == "even" else [3, 3, 3, 1]
  assert dropped.sum(1).tolist() == want + [0, 0, 0]
  assert not np.asarray(shares(3, True)).any()


# ---------------------------------------------- MultiSFL loop equivalence
MS_SIZES = [13, 7, 20, 5, 9, 11, 6]
MS_DATA = make_fed_data(MS_SIZES, seed=1)
SPEC = multisfl.PAPER_READING  # the cases below were written for the paper's reading
CASES = {
    # replay with the adaptive proportion; cut 1 puts a BatchNorm conv stage in
    # the server portion, so replay and main features share a BN batch
    "adaptive": {"cut": 1, "rounds": 2,
                 "opts": {**SPEC, "p0": 0.3, "p_min": 0.05, "p_max": 0.7}},
    # Conf2 with two local epochs (the same replay shares every epoch)
    "fixed-E2": {"cut": 1, "rounds": 1, "local_epochs": 2, "client_exec": "map",
                 "opts": {**SPEC, "replay": "fixed", "p0": 0.5}},
    # Conf1
    "off": {"cut": 1, "rounds": 1, "opts": {**SPEC, "replay": "off"}},
    # the authors' request floor: |D_i| p < 1 here, so every replayed sample
    # is there because of min_request
    "floor": {"cut": 1, "rounds": 2,
              "opts": {**SPEC, "p0": 0.01, "p_min": 0.01, "p_max": 0.04,
                       "min_request": 6}},
    # the authors' defaults: CLP rule on their gradient signal (a 2-round
    # window, so round 2 already compares against a real round), their score
    # recursion, request floor L and rounding
    "authors": {"cut": 1, "rounds": 3, "opts": {"p0": 0.05, "p_max": 0.6,
                                                 "p_threshold": 0.08, "clp_window": 2}},
    # the authors' defaults over two local epochs: a fresh replay copy per epoch
    "authors-E2": {"cut": 1, "rounds": 2, "local_epochs": 2, "client_exec": "map",
                   "opts": {"p0": 0.3, "p_max": 0.6}},
    # the same, clients unrolled: branches without a batch skip the step
    "authors-unroll": {"cut": 1, "rounds": 2, "local_epochs": 2, "client_exec": "unroll",
                       "opts": {"p0": 0.3, "p_max": 0.6}},
    # the --DB 2 rule on -FGN, two local epochs
    "relative-E2": {"cut": 1, "rounds": 3, "local_epochs": 2,
                    "opts": {"p_rule": "relative", "grad_signal": "spec", "p0": 0.2,
                             "p_max": 0.7, "clp_window": 1}},
}


_SETUPS, _DECIDE = {}, {}


def ms_setup(case):
  """The case's setup, built once (jitted programs close over it)."""
  if case not in _SETUPS:
    _SETUPS[case] = _ms_setup(case)
  return _SETUPS[case]


def ms_decide(setup):
  """``multisfl.decide`` jitted once per setup."""
  if id(setup) not in _DECIDE:
    _DECIDE[id(setup)] = jax.jit(lambda s, k: multisfl.decide(setup, s, MS_DATA, k))
  return _DECIDE[id(setup)]


def _ms_setup(case):
  c = CASES[case]
  return make_setup(tiny_model(), MS_DATA, clients_per_round=3, cut=c["cut"],
                    local_epochs=c.get("local_epochs", 1), lr_decay=1.0,
                    client_exec=c.get("client_exec", "vmap"),
                    options=MultiSFLOptions(**c["opts"]))


@functools.partial(jax.jit, static_argnums=(0, 8))
def ref_grad_separate(model, p, s, act, y, m, ract, yr, start):
  """The authors' server step: main features, then replay features, each
  its own BatchNorm batch; one loss over both logits."""
  def f(p_, a_):
    lm, mid = model.apply(p_, s, a_, start=start, train=True, mask=m)
    lr_, out = model.apply(p_, mid, ract, start=start, train=True)
    logits, labels = jnp.concatenate([lm, lr_]), jnp.concatenate([y, yr])
    valid = jnp.concatenate([jnp.asarray(m, jnp.float32), jnp.ones(len(yr))])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)[:, 0]
    return jnp.sum(nll * valid) / jnp.sum(valid), out
  (loss, ns), (gp, ga) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(p, act)
  return loss, ns, gp, ga


def ref_multisfl(setup, data, key, rounds):
  """MultiSFL with Python loops; the sample choices come from ``decide``."""
  model, cut = setup.model, setup.cut
  o = multisfl.options(setup)
  n, L = setup.clients_per_round, setup.num_classes
  st0 = multisfl.init(setup, key)
  p1 = [take(st0.part1, i) for i in range(n)]
  s1 = [take(st0.part1_stats, i) for i in range(n)]
  p2 = [take(st0.part2, i) for i in range(n)]
  s2 = [take(st0.part2_stats, i) for i in range(n)]
  b2 = [zeros_like(p2[0]) for _ in range(n)]     # server momentum (server_opt="keep")
  table, sizes, y = (np.asarray(getattr(data, k)) for k in ("table", "sizes", "y"))
  counts = np.stack([np.bincount(y[table[k, :sizes[k]]], minlength=L)
                     for k in range(len(sizes))])
  num, den = np.zeros((n, L)), 0.0
  p = 0.0 if o.replay == "off" else o.p0
  fgn_prev, hist = 0.0, []
  signals = [0.0] * (o.clp_window + 1)         # the authors pad the history with zeros
  decide = ms_decide(setup)
  for r in range(rounds):
    st = st0.replace(round=jnp.int32(r), p=jnp.float32(p),
                     score_num=jnp.asarray(num, jnp.float32),
                     score_den=jnp.float32(den))
    d = decide(st, jax.random.fold_in(key, r))
    clients, idx, mask = np.asarray(d.clients), np.asarray(d.idx), np.asarray(d.mask)
    ridx, rmask, lr = np.asarray(d.ridx), np.asarray(d.rmask), float(d.lr)
    # Eqs. 2-4 (or the authors' recursion and rounding), looped
    if o.score_update == "eq2":
      num = o.gamma * num + counts[clients]
      den = o.gamma * den + 1.0
    else:  # num holds the normalised score, den the weight w
      den = o.gamma * den + 1.0
      num = (o.gamma * num + counts[clients]) / den
    quota = np.zeros((n, L), int)
    for i in range(n):
      sv = num[i] / den if o.score_update == "eq2" else num[i]
      prior = np.maximum(0.0, sv.mean() - sv)
      if prior.sum() > 0 and o.replay != "off":
        request = sizes[clients[i]] * np.float32(p)
        if o.request_rounding == "authors":
          request = np.floor(request)
        request = max(o.min_request, request)
        quota[i] = np.floor(request * prior / prior.sum())
    np.testing.assert_array_equal(np.asarray(d.quota), quota)
    f1, fs1 = list(p1), list(s1)                  # frozen round-start copies
    b1 = [zeros_like(p1[0]) for _ in range(n)]
    if o.server_opt == "reset":
      b2 = [zeros_like(p2[0]) for _ in range(n)]
    gsum = [zeros_like(p2[0]) for _ in range(n)]
    steps, lsum, cnt, sqs = np.zeros(n), 0.0, 0, np.zeros(n)
    t_ep = idx.shape[0] // setup.local_epochs
    for i in range(n):
      for t in range(idx.shape[0]):
        if o.replay_model == "epoch" and t % t_ep == 0:  # the copy of each epoch
          f1[i], fs1[i] = p1[i], s1[i]
        m = mask[t, i]
        if not m.any():
          continue
        x, yy = gather(data, idx[t, i])
        act, ns1 = ref_fwd(model, p1[i], s1[i], x, m)
        rv = ridx[t, i][rmask[t, i]]
        if len(rv):
          xr, yr = gather(data, rv)
          ract, _ = ref_fwd(model, f1[i], fs1[i], xr, np.ones(len(rv), bool))
          a_all, y_all = jnp.concatenate([act, ract]), jnp.concatenate([yy, yr])
          m_all = np.concatenate([m, np.ones(len(rv), bool)])
        else:
          a_all, y_all, m_all = act, yy, m
        if len(rv) and o.server_forward == "separate":
          loss, ns2, g2, ga = ref_grad_separate(model, p2[i], s2[i], act, yy, m, ract, yr,
                                                cut)
        else:
          loss, ns2, g2, ga = ref_grad(model, p2[i], s2[i], a_all, y_all, m_all, cut)
        gsum[i] = jax.tree.map(jnp.add, gsum[i], g2)
        steps[i] += 1
        p2[i], b2[i] = ref_sgd(p2[i], g2, b2[i], lr, setup)
        s2[i] = ns2
        g1 = ref_bwd(model, p1[i], s1[i], x, m, ga[:len(m)])
        sqs[i] += sum(2 * float(jnp.sum(g ** 2)) for g in jax.tree.leaves(g1)) + sum(
            float(jnp.sum(g ** 2)) for g in jax.tree.leaves(g2))
        p1[i], b1[i] = ref_sgd(p1[i], g1, b1[i], lr, setup)
        s1[i] = ns1
        lsum += float(loss) * m_all.sum()
        cnt += m_all.sum()
    # Eq. 5 (docs/methods-multisfl.md#adaptive-proportion)
    sq = [sum(float(jnp.sum((g / steps[i]) ** 2)) for g in jax.tree.leaves(gsum[i]))
          for i in range(n)]
    fgn_now = float(np.mean([-lr * s for s in sq]))
    p_used = p
    g = (float(np.mean(lr * sqs / setup.local_epochs)) if o.grad_signal == "authors"
         else -fgn_now)
    signals = signals[1:] + [g]
    old = max(np.mean(signals[:-1]), 1e-7)
    delta = (np.mean(signals[1:]) - old) / old
    if o.replay != "adaptive":
      pass
    elif o.p_rule == "spec":
      if r > 0 and fgn_prev != 0:
        p = float(np.clip(p * (1 + (fgn_now - fgn_prev) / abs(fgn_prev)), o.p_min, o.p_max))
    elif o.p_rule == "clp":
      if delta > 0:
        p = p + o.p_step if p >= o.p_threshold else min(o.p_threshold, 2 * p)
      else:
        p = max(o.p_min, p / 2)
      p = min(p, o.p_max)
    elif r != 0:  # relative
      p = min(max(o.p_late_min if r > 10 else o.p_min, p * (1 + delta)), o.p_max)
    fgn_prev = fgn_now
    # master and pull-back
    for lst in (p1, s1, p2, s2):
      master = ref_avg(lst, np.ones(n))
      lst[:] = [jax.tree.map(lambda w, mw: (w + o.alpha * mw) / (1 + o.alpha), w_i, master)
                for w_i in lst]
    hist.append({"loss": lsum / cnt, "p": p_used, "fgn": fgn_now, "signal": g, "quota": quota,
                 "served": np.asarray(d.served), "clients": clients})
  return (p1, s1, p2, s2, p, num, den), hist


@pytest.mark.parametrize("case", sorted(CASES))
def test_multisfl_equals_loop(case):
  setup = ms_setup(case)
  key = jax.random.key(7)
  rounds = CASES[case]["rounds"]
  rnd = jax.jit(lambda s, k: multisfl.round(setup, s, MS_DATA, k))
  state = multisfl.init(setup, key)
  ms = []
  for r in range(rounds):
    state, m = rnd(state, jax.random.fold_in(key, r))
    ms.append(jax.device_get(m))
  (p1, s1, p2, s2, p, num, den), hist = ref_multisfl(setup, MS_DATA, key, rounds)
  for i in range(setup.clients_per_round):
    chex.assert_trees_all_close(take(state.part1, i), p1[i], **TOL)
    chex.assert_trees_all_close(take(state.part1_stats, i), s1[i], **TOL)
    chex.assert_trees_all_close(take(state.part2, i), p2[i], **TOL)
    chex.assert_trees_all_close(take(state.part2_stats, i), s2[i], **TOL)
  np.testing.assert_allclose(float(state.p), p, rtol=1e-5)
  if multisfl.options(setup).score_update == "eq2":
    np.testing.assert_allclose(state.score_num / state.score_den, num / den, rtol=1e-6)
  else:
    np.testing.assert_allclose(state.score_num, num, rtol=1e-6)
    np.testing.assert_allclose(state.score_den, den, rtol=1e-6)
  for m, h in zip(ms, hist):
    np.testing.assert_allclose(m["loss"], h["loss"], **TOL)
    np.testing.assert_allclose(m["p"], h["p"], rtol=1e-6)
    np.testing.assert_allclose(m["fgn"], h["fgn"], rtol=1e-4)
    np.testing.assert_allclose(m["grad_signal"], h["signal"], rtol=1e-4)
    np.testing.assert_array_equal(m["replay_requested"], h["quota"])
    np.testing.assert_array_equal(m["replay_served"], h["served"])
    np.testing.assert_array_equal(m["clients"], h["clients"])
  # the output model is the master: the branch mean
  params, _ = multisfl.output_model(setup, state)
  chex.assert_trees_all_close(params, ref_avg(p1, np.ones(3)) + ref_avg(p2, np.ones(3)),
                              **TOL)
  if case == "off":
    assert all(m["replay_samples"] == 0 and m["p"] == 0 for m in ms)
  else:  # the guard: replay happened, and the adaptive p moved
    assert sum(int(m["replay_samples"]) for m in ms) > 0
    if case == "adaptive":   # p_1 = p_0, then FGN moves it
      assert ms[0]["p_next"] == ms[0]["p"] and ms[1]["p_next"] != ms[1]["p"]
    if case == "authors":    # the zero-padded window: p doubles at once, up to 0.08
      assert ms[0]["p_next"] == pytest.approx(0.08)
      assert all(m["p_next"] != m["p"] for m in ms)
    if case == "relative-E2":  # round 0 keeps p, later rounds move it
      assert ms[0]["p_next"] == ms[0]["p"] and ms[1]["p_next"] != ms[1]["p"]


@pytest.mark.parametrize(("case", "p"), [("adaptive", 0.7), ("floor", 0.04),
                                         ("authors", 0.6), ("authors", 0.01),
                                         ("fixed-E2", 0.5), ("authors-E2", 0.6)])
def test_decide_never_replays_active_clients_and_fills_quotas(case, p):
  """Per branch, in every local epoch (each replays the round's list)."""
  setup = ms_setup(case)
  data = MS_DATA
  st = multisfl.init(setup, jax.random.key(0)).replace(p=jnp.float32(p))
  table, sizes, y = (np.asarray(getattr(data, k)) for k in ("table", "sizes", "y"))
  owner = np.full(len(y), -1)
  for k in range(len(sizes)):
    owner[table[k, :sizes[k]]] = k
  hold = np.stack([np.bincount(y[table[k, :sizes[k]]], minlength=4)
                   for k in range(len(sizes))])
  decide = ms_decide(setup)
  requested, from_main = 0, 0
  for seed in range(3):
    d = jax.device_get(decide(st, jax.random.key(seed)))
    requested += int(d.quota.sum())
    active = np.zeros(len(sizes), bool)
    active[d.clients] = True
    nb = d.ridx.shape[0] // setup.local_epochs
    for i, e in itertools.product(range(3), range(setup.local_epochs)):
      epoch = slice(e * nb, (e + 1) * nb)
      rv = d.ridx[epoch, i][d.rmask[epoch, i]]
      # the clients that never assist branch i: all main clients, or its own
      barred = active if multisfl.options(setup).assistants == "inactive" else (
          np.arange(len(sizes)) == d.clients[i])
      assert not barred[owner[rv]].any()
      from_main += int(active[owner[rv]].sum())
      want = np.minimum(d.quota[i], hold[~barred].sum(0))
      np.testing.assert_array_equal(d.served[i], want)
      if multisfl.options(setup).replay_schedule == "even":  # each sample once an epoch
        assert len(set(rv.tolist())) == len(rv)
        np.testing.assert_array_equal(np.bincount(y[rv], minlength=4), want)
      else:  # a helper batch never repeats a sample; all of them are from the list
        for t in range(e * nb, (e + 1) * nb):
          share = d.ridx[t, i][d.rmask[t, i]]
          assert len(set(share.tolist())) == len(share)
        # distinct replayed samples of a class never exceed the list's count of it
        assert (np.bincount(y[np.unique(rv)], minlength=4) <= want).all()
        assert want.sum() == 0 or len(rv) > 0
      # replay only alongside the main client's existing batches
      assert not (d.rmask[:, i].any(1) & ~d.mask[:, i].any(1)).any()
  assert requested > 0   # the guard: the case does request replay
  if multisfl.options(setup).assistants == "not_self":  # and other main clients assist
    assert from_main > 0


# ------------------------------------------- SFL-form baselines vs loops
SF_DATA = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))


@functools.partial(jax.jit, static_argnums=(0, 7))
def ref_ntd_grad(model, p, s, act, y, m, t_logits, cut_beta_tau):
  cut, beta, tau = cut_beta_tau
  def f(p_, a_):
    logits, ns = model.apply(p_, s, a_, start=cut, train=True, mask=m)
    ce = masked_cross_entropy(logits, y, m)
    return ce + beta * fedntd.ntd_loss(logits, t_logits, y, m, tau), (ns, ce)
  (_, (ns, ce)), (gp, ga) = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(p, act)
  return ce, ns, gp, ga


@functools.partial(jax.jit, static_argnums=(0,))
def ref_logits(model, p, s, x):
  return model.apply(p, s, x, train=False)[0]


class NTDRefServer(RefServer):
  """SFL's server with FedNTD's loss; the teacher is the round's starting
  global model."""

  def begin_round(self, part1, stats1):
    self.teacher = (part1 + self.part2, stats1 + self.stats2)

  def serve(self, act, y, m, lr, client, x):
    setup = self.setup
    tl = ref_logits(setup.model, *self.teacher, x)
    cfg = (setup.cut, setup.options.beta, setup.options.tau)
    l, ns2, g2, ga = ref_ntd_grad(setup.model, self.part2, self.stats2, act, y, m, tl, cfg)
    self.part2, self.buf = ref_sgd(self.part2, g2, self.buf, lr, setup)
    self.stats2 = ns2
    return l, ga


def fedmut_starts(setup, part1):
  """FedMut's per-leaf mutated starts, looped (``prev`` is the previous
  round's global part-1)."""
  prev = {"p": part1}

  def starts(r, rkey, part1, n):
    a, rate = setup.options.radius, setup.options.acc_rate
    beta = rate * (1 - min(max(r - 1, 0) / setup.options.bound, 1))
    leaves, tdef = jax.tree.flatten(part1)
    signs = np.asarray(sfl_fedmut.mutation_signs(
        jax.random.fold_in(rkey, sfl_fedmut._MUT_STREAM), len(leaves), n, beta))
    old = jax.tree.leaves(prev["p"])
    prev["p"] = part1
    return [jax.tree.unflatten(tdef, [w + a * signs[li, c] * (w - pv)
                                      for li, (w, pv) in enumerate(zip(leaves, old))])
            for c in range(n)]
  return starts


def fedexp_aggregate(eps, weights="uniform", form="paper", setup=None):
  """FedExp's server step on the client portions, looped (``weights =
  "samples"``: SFL's sample weights for a_i instead of 1/M; ``form =
  "authors"``: the FedExp code's ``M eps_t``, eps_t shrinking with the
  square of round r's learning rate, ``setup``'s decay from its
  ``lr_decay_start``)."""
  calls = [0]

  def aggregate(part1, stats1, p1, s1, sizes):
    n = len(p1)
    r, calls[0] = calls[0], calls[0] + 1
    eps_r = eps
    if form == "authors":
      lr_r = max(setup.lr * setup.lr_decay ** max(r - setup.lr_decay_start + 1, 0),
                 setup.lr_min)
      eps_r = n * eps * (lr_r / setup.lr) ** 2
    w = (np.asarray(sizes, np.float64) / np.sum(sizes) if weights == "samples"
         else np.ones(n) / n)
    deltas = [jax.tree.map(lambda g, c_: g - c_, part1, pc) for pc in p1]
    dbar = ref_avg(deltas, w)
    sq = lambda t_: sum(float(jnp.sum(a_ ** 2)) for a_ in jax.tree.leaves(t_))
    eta = max(1.0, sum(w_ * sq(d_) for w_, d_ in zip(w, deltas)) / (2 * (sq(dbar) + eps_r)))
    return jax.tree.map(lambda g, d_: g - eta * d_, part1, dbar), ref_avg(s1, w)
  return aggregate


def ref_sfl_form(mod, setup, data, key, rounds):
  """SFL in loops (``ref_split``) with the method's piece (loss, starts,
  aggregation) in loops."""
  st = mod.init(setup, key)
  server = (NTDRefServer if mod is sfl_fedntd else RefServer)(setup, st.part2,
                                                               st.part2_stats)
  kw = {}
  if mod is sfl_fedmut:
    kw["starts"] = fedmut_starts(setup, st.part1)
  if mod is sfl_fedexp:
    kw["aggregate"] = fedexp_aggregate(setup.options.eps, setup.options.weights,
                                       setup.options.eps_form, setup)
  (part1, stats1), losses, _ = ref_split(setup, data, key, rounds, st.part1,
                                         st.part1_stats, server, st.label_rank, **kw)
  return (part1, stats1, server.part2, server.stats2), losses


SF_SETUP_CUT = 2  # make_setup's cut: part-1 is the model's first two stages

SF_CASES = {
    "sfl_fedntd": (sfl_fedntd, {"beta": 2.0, "tau": 2.0}),
    "sfl_fedexp": (sfl_fedexp, {"eps": 1e-3, "weights": "uniform"}),
    "sfl_fedexp-samples": (sfl_fedexp, {"eps": 1e-3, "weights": "samples"}),
    # the FedExp code's eps: 3 eps (lr_t / lr)^2, lr halved from round 2
    # (eta_g 1.38 in round 1 where the paper's eps gives 1.46)
    "sfl_fedexp-authors": (sfl_fedexp, {"eps": 1e-3, "eps_form": "authors"},
                           {"lr_decay": 0.5, "lr_decay_start": 1}),
    "sfl_fedmut": (sfl_fedmut, {"radius": 4.0, "acc_rate": 0.3, "bound": 1}),
}


@pytest.mark.parametrize("name", sorted(SF_CASES))
def test_sfl_form_equals_loop(name):
  mod, opts, *extra = SF_CASES[name]
  setup = make_setup(tiny_model(), SF_DATA, clients_per_round=3, order="random",
                     options=get_method(name.split("-")[0]).options(**opts),
                     **(extra[0] if extra else {}))
  key = jax.random.key(9)
  rnd = jax.jit(lambda s, k: mod.round(setup, s, SF_DATA, k))
  state, losses, ms = mod.init(setup, key), [], []
  # FedMut's beta_t anneals from the third round on (t = the round that
  # produced the update direction; bound = 1)
  rounds = 3 if mod is sfl_fedmut else 2
  for r in range(rounds):
    state, m = rnd(state, jax.random.fold_in(key, r))
    losses.append(float(m["loss"]))
    ms.append(jax.device_get(m))
  (p1, s1, p2, s2), ref_losses = ref_sfl_form(mod, setup, SF_DATA, key, rounds)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  # guards: the method's piece was active
  if mod is sfl_fedntd:
    assert ms[1]["reg_loss"] > 0
  if mod is sfl_fedexp:
    assert max(m["eta_g"] for m in ms) > 1
  if mod is sfl_fedmut:
    assert ms[0]["mutation_norm"] == 0 and ms[1]["mutation_norm"] > 0
    # nothing to mutate along in round 1; then beta_t of the update of round t
    assert [float(m["mutation_beta"]) for m in ms] == pytest.approx([0.0, 0.3, 0.0])


def test_fedexp_evaluates_the_mean_of_the_last_two_when_asked():
  """``evaluate = "last_two"``: the same training; the output's part-1 is the
  round's global part-1 after round 1, then the mean of the last two."""
  key = jax.random.key(9)
  outs, states = {}, {}
  for ev in ("last", "last_two"):
    setup = make_setup(tiny_model(), SF_DATA, clients_per_round=3, order="random",
                       options=get_method("sfl_fedexp").options(evaluate=ev))
    rnd = jax.jit(lambda s, k, setup=setup: sfl_fedexp.round(setup, s, SF_DATA, k))
    st, seen = sfl_fedexp.init(setup, key), []
    for r in range(3):
      st, _ = rnd(st, jax.random.fold_in(key, r))
      seen.append((st, sfl_fedexp.output_model(setup, st)))
    outs[ev], states[ev] = seen, [x[0] for x in seen]
  chex.assert_trees_all_equal(states["last"], states["last_two"])
  c = SF_SETUP_CUT
  for r, ((st, (params, stats)), (_, (last, last_stats))) in enumerate(
      zip(outs["last_two"], outs["last"], strict=True)):
    chex.assert_trees_all_equal(params[c:], last[c:])  # part-2 as it stands
    chex.assert_trees_all_equal(stats, last_stats)
    want = (last[:c] if r == 0 else jax.tree.map(
        lambda a, b: (a + b) / 2, outs["last"][r][1][0][:c], outs["last"][r - 1][1][0][:c]))
    chex.assert_trees_all_close(params[:c], want, rtol=1e-6, atol=1e-7)
  assert not np.allclose(jax.tree.leaves(outs["last_two"][2][1][0][:c])[0],
                         jax.tree.leaves(outs["last"][2][1][0][:c])[0])


def test_fedexp_step_hand_case():
  g = {"w": jnp.zeros(2)}
  stacked = {"w": -jnp.array([[1.0, 0.0], [-1.0, 0.2]])}   # D_1, D_2
  new, eta = sfl_fedexp.fedexp_step(g, stacked, jnp.ones(2), 1e-3)
  # D_bar = (0, 0.1); eta = ((1 + 1.04) / 2) / (2 (0.01 + 0.001))
  assert float(eta) == pytest.approx(1.02 / 0.022, rel=1e-5)
  np.testing.assert_allclose(new["w"], [0.0, -0.1 * 1.02 / 0.022], rtol=1e-5)
  # aligned updates: eta = 1, plain averaging
  new, eta = sfl_fedexp.fedexp_step(g, {"w": -jnp.ones((3, 2))}, jnp.ones(3), 1e-3)
  assert float(eta) == 1.0
  np.testing.assert_allclose(new["w"], [-1.0, -1.0])


@pytest.mark.parametrize("n", [4, 5])
def test_mutation_signs_are_balanced_per_layer(n):
  s = np.asarray(sfl_fedmut.mutation_signs(jax.random.key(0), 6, n, 0.25))
  for row in s:
    assert sorted(row.tolist()) == sorted([1.0] * (n // 2) + [-0.75] * (n // 2)
                                          + [0.0] * (n % 2))
  assert len({tuple(r) for r in s}) > 1  # arranged independently per layer


# --------------------------------------------------------- CLI and models
SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=240", "dataset.test_size=40", "model.width=4",
       "model.hidden=8", "model.norm=batch", "exec.progress=false",
       "partition.num_clients=8", "method.clients_per_round=3", "method.batch_size=16"]


# The SFL-family variants share one runner path: FedMut (the one whose state
# grows) in CI, FedNTD and FedExp in the slow suite.
@pytest.mark.parametrize("name,extra", [
    ("multisfl", ["run.rounds=2", "partition.name=dirichlet", "partition.alpha=0.3",
                  "method.p0=0.2"]),
    pytest.param("sfl_fedntd", ["run.rounds=1"], marks=pytest.mark.slow),
    pytest.param("sfl_fedexp", ["run.rounds=1"], marks=pytest.mark.slow),
    ("sfl_fedmut", ["run.rounds=1"]),
])
def test_cli_smoke(tmp_path, name, extra):
  out = tmp_path / name
  assert cli.main(["run", *SYN, f"run.dir={out}", f"method.name={name}", *extra]) == 0
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert len(recs) == (2 if name == "multisfl" else 1)
  for r in recs:
    assert np.isfinite(r["accuracy"]) and np.isfinite(r["train_loss"])
    assert r["bytes_up"] > 0 and len(r["clients"]) == 3
  if name == "multisfl":
    r = recs[-1]
    assert np.shape(r["replay_requested"]) == (3, 4) == np.shape(r["replay_served"])
    assert {"p", "p_next", "fgn", "assistants", "replay_samples"} <= set(r)


@pytest.mark.parametrize("bad", ["method.gamma=1.5", "method.min_request=-3"])
def test_multisfl_bad_options_are_config_errors(tmp_path, capsys, bad):
  code = cli.main(["run", *SYN, f"run.dir={tmp_path / 'r'}", "method.name=multisfl", bad])
  assert code == 2 and bad in capsys.readouterr().err
  assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name,stages,cut", [("mobilenet_v2", 20, 4), ("vgg16", 16, 4)])
@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28, 1)])
def test_new_model_shapes(name, stages, cut, shape):
  """Shapes only (``eval_shape``: traced, not compiled)."""
  m = get_model(name, shape, 7, width=0.125, conv_impl="xla", depthwise_impl="grouped")
  assert m.num_stages == stages == len(m.stage_names) and m.default_cut == cut
  params, stats = jax.eval_shape(m.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2,) + shape, jnp.float32)
  out = jax.eval_shape(lambda p, s, x: m.apply(p, s, x, train=True)[0], params, stats, x)
  assert out.shape == (2, 7)
  act = jax.eval_shape(lambda p, s, x: m.apply(p, s, x, train=False)[0],
                       params[:cut], stats[:cut], x)
  rest = jax.eval_shape(lambda p, s, a: m.apply(p, s, a, start=cut, train=False)[0],
                        params[cut:], stats[cut:], act)
  assert rest.shape == (2, 7)
  if name == "vgg16":   # the authors' cut: 128 channels at 1/4 resolution
    assert act.shape == (2, -(-shape[0] // 4), -(-shape[1] // 4), 16)
  else:                 # 24 channels at full resolution
    assert act.shape == (2, shape[0], shape[1], 3)


def test_class_pool_ignores_padding_width():
  """A seed's replay pool must not depend on how wide the table is padded
  (the widest client of every seed batched with it, e.g. by a sweep)."""
  d = make_fed_data([13, 7, 20, 5])
  table, sizes, y = d.table, d.sizes, d.y
  wide = jnp.pad(table, ((0, 0), (0, 17)))
  key = jax.random.key(3)
  class_pool = jax.jit(multisfl.class_pool, static_argnums=4)  # eagerly: an op a compile
  pool, start = class_pool(key, table, sizes, y, 4)
  pool_w, start_w = class_pool(key, wide, sizes, y, 4)
  np.testing.assert_array_equal(start, start_w)
  n = int(jnp.sum(sizes))  # the valid entries come first, grouped by (client, class)
  np.testing.assert_array_equal(pool[:n], pool_w[:n])


@pytest.mark.parametrize(("option", "other_value"), [("replay_model", "round"),
                                                     ("server_forward", "concat"),
                                                     ("replay_schedule", "even")])
def test_the_authors_options_change_the_training(option, other_value):
  """The guard of the authors' loop cases: with E = 2 a fresh replay copy per
  epoch trains differently from the round-start copy (E = 1: the same),
  separate server forwards (two BatchNorm batches at cut 1) differently from
  one over the concatenation, and the authors' helper batches differently
  from even slices."""
  setup = ms_setup("authors-E2")
  other = setup.replace(options=dataclasses.replace(setup.options, **{option: other_value}))
  key = jax.random.key(3)
  outs = []
  for s in (setup, other):
    state, m = jax.jit(lambda st, k, s=s: multisfl.round(s, st, MS_DATA, k))(
        multisfl.init(s, key), key)
    assert int(m["replay_samples"]) > 0
    outs.append(state.part2)
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(outs[0]),
                                                   jax.tree.leaves(outs[1])))


def test_round_reports_the_authors_bytes_when_asked():
  base = ms_setup("authors")
  setup = base.replace(options=dataclasses.replace(base.options, comm_accounting="authors"))
  key = jax.random.key(5)
  state = multisfl.init(setup, key)
  _, m = jax.jit(lambda st, k: multisfl.round(setup, st, MS_DATA, k))(state, key)
  # jitted: eagerly, each of the decision's draws and sorts compiles alone
  sizes = jax.jit(lambda st, k: multisfl.decide(setup, st, MS_DATA, k).sizes)(state, key)
  want = multisfl.authors_round_bytes(setup, m["samples"], sizes, state.p,
                                      int(m["assistants"].sum()))
  np.testing.assert_allclose([m["bytes_up"], m["bytes_down"]], [float(w) for w in want])
  _, spec = jax.jit(lambda st, k: multisfl.round(base, st, MS_DATA, k))(state, key)
  assert float(spec["bytes_up"]) != float(m["bytes_up"])  # the option is not a no-op
