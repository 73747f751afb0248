"""MultiSFL's option set: the authors' code by default, the paper's reading
by name (docs/methods-multisfl.md#jsfl-against-the-authors-code).
"""

from __future__ import annotations

import dataclasses
import math

from jsfl.core.data import round_options
from jsfl.core.setup import Setup
from jsfl.options import option, option_set

# The options that give the paper's reading where the authors' code differs
# (experiments/multisfl/README.md reproduces its results with it).
PAPER_READING = {"p_rule": "spec", "score_update": "eq2", "min_request": 0,
                "request_rounding": "spec", "assistants": "inactive", "server_opt": "keep",
                "replay_model": "round", "server_forward": "concat",
                "replay_schedule": "even"}


REPLAY_MODES = ("adaptive", "fixed", "off")
P_RULES = ("clp", "relative", "spec")
GRAD_SIGNALS = ("authors", "spec")
SCORE_UPDATES = ("authors", "eq2")
ROUNDINGS = ("authors", "spec")
ASSISTANTS = ("not_self", "inactive")
SERVER_OPTS = ("reset", "keep")
REPLAY_MODELS = ("epoch", "round")
SERVER_FORWARDS = ("separate", "concat")
SCHEDULES = ("authors", "even")
ACCOUNTINGS = ("spec", "authors")


# Each field's own range; MultiSFL's ``validate`` keeps the check between
# them (p_min <= p0 <= p_max with adaptive replay).  min_request sizes a
# static replay buffer, hence a finite bound; p0 and p_max bound it too.
@option_set
class MultiSFLOptions:
  replay: str = option("adaptive", "knowledge replay: adaptive proportion (MultiSFL), "
                       "fixed proportion p0 (ablation Conf2), off (ablation Conf1)",
                       choices=REPLAY_MODES)
  p0: float = option(0.01, "initial sampling proportion p_0 (the constant one when "
                     "replay='fixed')", range="[0, 1]")
  p_min: float = option(0.01, "lower clip of the adaptive proportion", range="(0, 1]",
                        batchable=True)
  p_max: float = option(0.5, "upper clip of the adaptive proportion", range="(0, 1]")
  gamma: float = option(0.5, "score-vector decay, 0 < gamma < 1", range="(0, 1)",
                        batchable=True)
  alpha: float = option(0.1, "pull-back weight of the master model (0 = none)",
                        range="[0, inf)", batchable=True)
  min_request: int = option(-1, "smallest total replay request of a branch and round: "
                            "max(min_request, |D_i| p_r); -1 = the number of classes L "
                            "(the authors' code), 0 = none (the paper)",
                            range="[-1, 1000000]")
  p_rule: str = option("clp", "how the adaptive proportion moves: clp = the authors' "
                       "critical-learning-period rule (--DB 1: doubled up to "
                       "p_threshold, then + p_step, while the windowed gradient signal "
                       "rises; else halved), relative = the authors' --DB 2 (p (1 + "
                       "relative change of the windowed signal), floored at p_min, at "
                       "p_late_min after round 10), spec = the paper's Eq. 6 "
                       "on FGN", choices=P_RULES)
  grad_signal: str = option("authors", "the gradient signal clp / relative compare: "
                            "authors = lr * mean over epochs of the summed per-step "
                            "2|g_client|^2 + |g_server|^2 (as their code sums it), mean "
                            "over branches; spec = -FGN = lr |mean server gradient|^2",
                            choices=GRAD_SIGNALS)
  clp_window: int = option(10, "rounds in each of the two windows the clp and relative "
                           "rules compare", range="[1, 1000]")
  p_threshold: float = option(0.2, "clp: doubling stops here; above it p grows by p_step",
                              range="(0, 1]", batchable=True)
  p_step: float = option(0.01, "clp: the growth of p above p_threshold", range="[0, 1]",
                         batchable=True)
  p_late_min: float = option(0.05, "relative: the floor of p after round 10",
                             range="[0, 1]", batchable=True)
  score_update: str = option("authors", "score vectors: authors = their recursion w <- "
                             "gamma w + 1, sv <- (gamma sv + L_i[r]) / w on the "
                             "normalised sv; eq2 = the paper's Eq. 2",
                             choices=SCORE_UPDATES)
  request_rounding: str = option("authors", "per-class quota: authors = "
                                 "floor(floor(total) share_c); spec = floor(total "
                                 "share_c) (the paper)", choices=ROUNDINGS)
  assistants: str = option("not_self", "who may assist a branch: not_self = every client "
                           "but the branch's own main client (the authors' code; other "
                           "main clients too), inactive = only clients not training "
                           "this round (the paper)", choices=ASSISTANTS)
  server_opt: str = option("reset", "server-portion optimiser state: reset = rebuilt "
                           "every round like the client portion's (the authors' code), "
                           "keep = kept across rounds (as every server portion)",
                           choices=SERVER_OPTS)
  replay_model: str = option("epoch", "the client portion that computes a branch's replay "
                             "features: epoch = a copy taken at the start of every local "
                             "epoch (the authors' code), round = the round-start copy, "
                             "the model dispatched to assistants (equal for E = 1)",
                             choices=REPLAY_MODELS)
  server_forward: str = option("separate", "how a step's main and replay features pass "
                               "the server portion: separate = two forwards, two "
                               "BatchNorm batches, logits concatenated (the authors' "
                               "code); concat = one forward over the concatenation "
                               "(docs/methods-multisfl.md#local-training)", choices=SERVER_FORWARDS)
  replay_schedule: str = option("authors", "how the replay list meets the main batches: "
                                "authors = helper batches of h = ceil(Q / nb) for the "
                                "first ceil(Q / h) batches of every epoch, each the b-th "
                                "batch of a fresh shuffle of the list (a sample may come "
                                "twice or not at all in an epoch); even = every batch gets "
                                "its slice of one shuffle, the same every epoch",
                                choices=SCHEDULES)
  comm_accounting: str = option("spec", "bytes of a round: spec = float32 features and "
                                "int32 labels as sent, replay once; authors = "
                                "their count: no labels, replay as the requested total x "
                                "E features, the model to every assistant x E",
                                choices=ACCOUNTINGS)


def options(setup: Setup, data=None) -> MultiSFLOptions:
  """The run's option set (with ``data``: as the round sees it, the slot's
  batchable values), ``min_request = -1`` resolved to the number of classes."""
  o = setup.options if data is None else round_options(setup, data)
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
