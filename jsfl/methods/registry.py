"""Every method by name: its module and its option set.  Importable without
JAX, so the config schema, its checks and ``docs/config.md`` come from here.

A method is registered as ``register(name, module, options)``: ``module``
defines ``METHOD`` (a ``jsfl.methods.base.Method``), ``options`` is its
option set (``jsfl.options.option_set``), whose fields are the method's own
``[method]`` keys.  A field is *batchable* when it is a scalar that only
enters the round's arithmetic (runs that differ in it could share one
compiled program) and static otherwise: choices, counts, cut indices,
window lengths, bounds that size a buffer, switches.
"""

from __future__ import annotations

from typing import NamedTuple

from jsfl.options import NoOptions, option, option_set


class Registered(NamedTuple):
  module: str      # defines METHOD
  options: type    # its option set


METHODS: dict[str, Registered] = {}


def register(name: str, module: str, options: type = NoOptions) -> None:
  """Makes method ``name`` (``module.METHOD``, options ``options``) known to
  the config, the CLI and the runner."""
  if not hasattr(options, "of"):
    raise TypeError(f"{name}: options={options!r} is not an option set "
                    "(decorate it with jsfl.options.option_set)")
  METHODS[name] = Registered(module, options)


# ---------------------------------------------------------------- SplitFed
register("fedavg", "jsfl.methods.fedavg")
register("splitfedv1", "jsfl.methods.splitfedv1")
register("sfl", "jsfl.methods.sfl")


# The SplitFed baselines of the Hydra paper.
register("splitfedv3", "jsfl.methods.splitfedv3")
register("splitnn", "jsfl.methods.splitnn")


# -1 is the sentinel; its ``validate`` checks the cut against the model's stages.
@option_set
class MultiHeadOptions:
  head_cut: int = option(-1, "first stage of the per-client heads; -1 = the model's "
                         "default_head_cut", range="[-1, 10000]")


register("multihead", "jsfl.methods.multihead", MultiHeadOptions)

MERGE_GRADS = ("client_mean", "merged")


@option_set
class MergeSFLOptions:
  grad_scale: str = option("client_mean", "cut-layer gradient a client gets back: "
                           "client_mean = that of its own batch's mean loss (the authors' "
                           "code: the merged gradient times K), merged = its share of the "
                           "merged batch's mean loss", choices=MERGE_GRADS)
  part1_copies: int = option(10, "part-1 copies per client, used round robin over its "
                             "batches, only the last one averaged at round end (the "
                             "authors' code, whose default is 10: with fewer than 10 "
                             "batches a round that copy never trains); 1 = one part-1 "
                             "per client", range="[1, 1000]")


register("mergesfl", "jsfl.methods.mergesfl", MergeSFLOptions)

# ------------------------------------------------------------------- Hydra
SUPERCLASS_NAMES = ("authors", "consecutive", "cifar10", "fashion_mnist")
GROUPINGS = ("table", "algorithm2")


# Ranges hold the sentinels (groups 0, head_cut -1) and a generous upper
# bound; Hydra's ``validate`` checks them against the model and the dataset.
@option_set
class HydraOptions:
  groups: int = option(0, "number of heads G (0 = number of labels L)",
                       range="[0, 1000000]")
  head_cut: int = option(-1, "first stage of the heads (-1 = the model's default or the "
                         "`head` preset)", range="[-1, 10000]")
  head: str = option("", "named head length of the model (MobileNetV1: 'small' = last "
                     "2 stages, 'large' = from stage 20)")
  superclasses: str = option("authors", "label -> group table when G < L: authors = the "
                             "authors' code's tables (G = 5 or 2, 10 labels), cifar10 = the "
                             "paper's CIFAR-10 tables, fashion_mnist, consecutive (any L, G)",
                             choices=SUPERCLASS_NAMES)
  grouping: str = option("table", "which head a client trains: table = the head of its "
                         "dominant label's group (the authors' code), algorithm2 = the "
                         "paper's balanced assignment on the label counts",
                         choices=GROUPINGS)


register("hydra", "jsfl.methods.hydra", HydraOptions)

# ------------------------------------------ sequential FL and its baselines
register("fedseq", "jsfl.methods.fedseq")

KD_METRICS = ("kl", "l1", "l2", "js")
KD_SELECTIONS = ("greedy", "random")
KD_WEIGHTINGS = ("discrepancy", "equal")
TEACHER_EXECS = ("auto", "vmap", "unroll", "map")


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
  teacher_exec: str = option("auto", "how the teachers' forward runs: one vmapped "
                             "forward over the stacked teachers, or unrolled; auto = "
                             "unroll on CPU, vmap elsewhere", choices=TEACHER_EXECS)
  teacher_cache: bool = option(True, "run the teachers once per client on its first "
                               "epoch and look their logits up in later epochs (same "
                               "values, E times fewer teacher forwards)")


register("sfedkd", "jsfl.methods.sfedkd", SFedKDOptions)

FISHER_MODES = ("batch", "sample")


# lam < 0 would reward moving away from the consolidated weights; sigma > 1
# would grow old importance every round instead of decaying it.
@option_set
class CWCOptions:
  lam: float = option(1.0, "consolidation penalty coefficient lambda (0 = FedSeq)",
                      range="[0, inf)", batchable=True)
  sigma: float = option(0.5, "decay of the importance matrix at each round start "
                        "(0 = forget, 1 = keep)", range="[0, 1]", batchable=True)
  fisher: str = option("batch", "diagonal Fisher estimator", choices=FISHER_MODES)


register("cwc", "jsfl.methods.cwc", CWCOptions)


# mu < 0 would reward drifting from the global model (the loss is unbounded
# below); mu = 0 is FedAvg.
@option_set
class FedProxOptions:
  mu: float = option(0.01, "proximal coefficient mu (0 = FedAvg)", range="[0, inf)",
                     batchable=True)


register("fedprox", "jsfl.methods.fedprox", FedProxOptions)


# lam < 0 would reward moving away from the other clients' important weights.
@option_set
class FedCurvOptions:
  lam: float = option(1.0, "FedCurv penalty coefficient lambda (0 = FedAvg)",
                      range="[0, inf)", batchable=True)
  fisher: str = option("batch", "diagonal Fisher estimator", choices=FISHER_MODES)


register("fedcurv", "jsfl.methods.fedcurv", FedCurvOptions)


# beta < 0 would push the local model away from the global one; tau divides
# the logits (tau = 0 is a division by zero).
@option_set
class FedNTDOptions:
  beta: float = option(1.0, "weight of the not-true distillation term (0 = FedAvg)",
                       range="[0, inf)", batchable=True)
  tau: float = option(1.0, "distillation temperature", range="(0, inf)", batchable=True)


register("fedntd", "jsfl.methods.fedntd", FedNTDOptions)

# ---------------------- MultiSFL (KoReA-SFL) and the SFL forms of its baselines
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
                            "(the authors' code), 0 = none (SPEC 4.4)",
                            range="[-1, 1000000]")
  p_rule: str = option("clp", "how the adaptive proportion moves: clp = the authors' "
                       "critical-learning-period rule (--DB 1: doubled up to "
                       "p_threshold, then + p_step, while the windowed gradient signal "
                       "rises; else halved), relative = the authors' --DB 2 (p (1 + "
                       "relative change of the windowed signal), floored at p_min, at "
                       "p_late_min after round 10), spec = SPEC 4.6 / the paper's Eq. 6 "
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
                             "normalised sv; eq2 = the paper's Eq. 2 (SPEC 4.3)",
                             choices=SCORE_UPDATES)
  request_rounding: str = option("authors", "per-class quota: authors = "
                                 "floor(floor(total) share_c); spec = floor(total "
                                 "share_c) (SPEC 4.4)", choices=ROUNDINGS)
  assistants: str = option("not_self", "who may assist a branch: not_self = every client "
                           "but the branch's own main client (the authors' code; other "
                           "main clients too), inactive = only clients not training "
                           "this round (the paper, SPEC 4.4)", choices=ASSISTANTS)
  server_opt: str = option("reset", "server-portion optimiser state: reset = rebuilt "
                           "every round like the client portion's (the authors' code), "
                           "keep = kept across rounds (SPEC 1.3)", choices=SERVER_OPTS)
  replay_model: str = option("epoch", "the client portion that computes a branch's replay "
                             "features: epoch = a copy taken at the start of every local "
                             "epoch (the authors' code), round = the round-start copy, "
                             "the model dispatched to assistants (equal for E = 1)",
                             choices=REPLAY_MODELS)
  server_forward: str = option("separate", "how a step's main and replay features pass "
                               "the server portion: separate = two forwards, two "
                               "BatchNorm batches, logits concatenated (the authors' "
                               "code); concat = one forward over the concatenation "
                               "(SPEC 4.2)", choices=SERVER_FORWARDS)
  replay_schedule: str = option("authors", "how the replay list meets the main batches: "
                                "authors = helper batches of h = ceil(Q / nb) for the "
                                "first ceil(Q / h) batches of every epoch, each the b-th "
                                "batch of a fresh shuffle of the list (a sample may come "
                                "twice or not at all in an epoch); even = every batch gets "
                                "its slice of one shuffle, the same every epoch",
                                choices=SCHEDULES)
  comm_accounting: str = option("spec", "bytes of a round: spec = float32 features and "
                                "int32 labels as sent, replay once (SPEC 1.4); authors = "
                                "their count: no labels, replay as the requested total x "
                                "E features, the model to every assistant x E",
                                choices=ACCOUNTINGS)


register("multisfl", "jsfl.methods.multisfl", MultiSFLOptions)
register("sfl_fedntd", "jsfl.methods.sfl_fedntd", FedNTDOptions)

FEDEXP_WEIGHTS = ("uniform", "samples")


# eps > 0 keeps eta_g finite when every client returns the global model
# (D_bar = 0); the bound is its ``validate``'s.
@option_set
class FedExpOptions:
  eps: float = option(1e-3, "FedExp's eps in the step-size denominator", range="(0, inf)",
                      batchable=True)
  weights: str = option("uniform", "client weights a_i: uniform 1/M (FedExp, SPEC 5) or "
                        "by sample count (SFL's)", choices=FEDEXP_WEIGHTS)


register("sfl_fedexp", "jsfl.methods.sfl_fedexp", FedExpOptions)


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


register("sfl_fedmut", "jsfl.methods.sfl_fedmut", FedMutOptions)


# ------------------------------------- the worked example of docs/extending.md
@option_set
class SmoothOptions:
  smoothing: float = option(0.1, "label smoothing eps", range="[0, 1)", batchable=True)


register("sfl_smooth", "jsfl.methods.sfl_smooth", SmoothOptions)
