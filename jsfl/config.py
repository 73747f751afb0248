"""Run configuration: TOML files plus ``section.key=value`` overrides.

Configs are data (big_vision style): a TOML file with the sections below,
every key optional.  :func:`load_config` resolves defaults, applies command
line overrides and validates everything before anything runs; a bad key,
type or value raises :class:`ConfigError` with one line naming it and what is
allowed.  ``docs/config.md`` is generated from :data:`SCHEMA`
(``python -m jsfl.config``).

Example::

  [run]
  rounds = 20
  seeds = 5
  [dataset]
  name = "fashion_mnist"
  [partition]
  name = "dominant_label"
  num_clients = 10
  p = 0.8
  [model]
  name = "small_cnn"
  [method]
  name = "sfl"
  order = "cyclic"
  [optim]
  lr = 0.05
  lr_decay = 0.993
  lr_min = 0.005
"""

from __future__ import annotations

import copy
import difflib
import math
import tomllib
from collections.abc import Sequence
from typing import Any

from jsfl import config_types
from jsfl.errors import UserError
from jsfl.methods.catalog import METHODS
from jsfl.options import INT32_MAX, Option, check

Field = Option


class ConfigError(UserError, ValueError):
  """A config key, type or value that is not allowed (CLI exit code 2)."""

  cell: str | None = None  # the cell of a program of several, when one is to blame


def _f(typ, default, help_, choices=None, range=None, batchable=False, item=None):
  return Option(typ, default, help_, choices, range, batchable, item)


# Sections whose extra keys are forwarded as options (validated by the owner:
# the dataset loader, the partition family, the model factory, the method).
OPEN_SECTIONS = ("dataset", "partition", "model", "method")

SCHEMA: dict[str, dict[str, Field]] = {
    "run": {
        "name": _f(str, "run", "run name; the run directory is out_dir/name-TIMESTAMP"),
        "out_dir": _f(str, "runs", "parent directory of run directories"),
        "dir": _f(str, "", "exact run directory (overrides out_dir/name)"),
        "rounds": _f(int, 20, "training rounds R", range="[1, inf)"),
        "eval_every": _f(int, 1, "evaluate every this many rounds (and after the last)",
                         range="[1, inf)"),
        "seeds": _f(int, 1, "seeds run together in one compiled program (vmap)",
                    range="[1, 4096]"),
        "seed": _f(int, 0, "first seed; seed s uses seed + s for init, partition, sampling, order",
                   range=f"[0, {INT32_MAX}]"),
        "checkpoint_every": _f(int, 10, "checkpoint (RUN_DIR/checkpoints, last 2 kept) every "
                               "this many rounds and after the last; 0 = only at the end "
                               "and on SIGTERM / SIGINT (resume: jsfl run --resume RUN_DIR)",
                               range="[0, inf)"),
        "on_divergence": _f(str, "stop_seed", "a seed whose training loss or parameters "
                            "become non-finite: stop_seed = its later rounds are not run "
                            "into the records, the other seeds go on; stop_run = the run "
                            "ends after that round. Either way summary.json names it "
                            "and jsfl run exits with status 2",
                            ("stop_seed", "stop_run")),
        "divergence_loss": _f(float, 1e4, "a seed whose mean training loss of a round "
                              "exceeds this has diverged too, as if it were non-finite "
                              "(cross-entropy at chance is ln(classes), 2.3 for 10); "
                              "0 = only non-finite values count", range="[0, inf)"),
        "trackers": _f(list, [], "experiment trackers written beside metrics.jsonl, one "
                       "tracker run per seed (and cell); a missing package or a failing "
                       "tracker is one warning line (docs/trackers.md)",
                       ("tensorboard", "wandb", "mlflow"), item=str),
        "profile": _f(list, [], "[first, last]: trace rounds first..last (1-based) with "
                      "the JAX profiler into RUN_DIR/profile (XProf, TensorBoard, "
                      "Perfetto); [] = off", range="[1, inf)", item=int),
        "step_confusion": _f(bool, False, "record the test-set confusion matrix of the "
                             "model after every step of a round into "
                             "RUN_DIR/confusion_steps.npz, in step_confusion_rounds: "
                             "split methods with a sequential server (SFL, Hydra) in a "
                             "cyclic order, a step being the server's consecutive visits "
                             "of clients of one dominant label (Hydra Fig. 11); "
                             "sequential methods (FedSeq, SFedKD, CWC), a step being one "
                             "client's training (SFedKD Fig. 1)"),
        "step_confusion_rounds": _f(list, [], "rounds (1-based) whose steps "
                                    "step_confusion records; [] = the last round",
                                    range="[1, inf)", item=int),
        "step_confusion_steps": _f(int, 0, "steps recorded per round, the round's first "
                                   "ones (each holds a model copy per seed through the "
                                   "round); 0 = one label cycle (L steps) on a split "
                                   "method, every client of the round on a sequential one",
                                   range="[0, 100000]"),
    },
    "dataset": {
        "name": _f(str, "fashion_mnist", "dataset; the files each reads, and the option "
                   "path naming them: docs/setting.md#datasets",
                   ("fashion_mnist", "mnist", "cifar10", "cifar100", "svhn", "tiny_imagenet",
                    "cinic10", "femnist", "ham10000", "synthetic")),
        "data_dir": _f(str, "", "directory holding the dataset files (optional)"),
        "download": _f(bool, True, "allow downloading into the cache dir when online"),
        "augment": _f(str, "none", "training-time augmentation: crop_flip = torchvision's "
                      "RandomCrop(size, padding=4) and RandomHorizontalFlip(), what both "
                      "papers' authors train CIFAR on; crop_flip_rotate = then "
                      "RandomRotation(15), the Hydra authors' CIFAR-100; flip = "
                      "RandomHorizontalFlip() alone (the Hydra authors' Tiny-ImageNet "
                      "flip, without its 224-pixel crop); drawn per sample "
                      "and round (docs/setting.md#augmentation); none = the images as "
                      "stored", ("none", "flip", "crop_flip", "crop_flip_rotate")),
        "mean": _f(list, [], "per-channel mean of x / 255 that inputs are normalised by; "
                   "[] = the training set's own (the Hydra authors' CIFAR-10: 0.4914, "
                   "0.4822, 0.4465; SVHN: 0.5 each)", range="[0, 1]", item=float),
        "std": _f(list, [], "per-channel std that inputs are divided by, with mean; [] = "
                  "the training set's own (the Hydra authors' CIFAR-10: 0.2023, 0.1994, "
                  "0.2010; SVHN: 0.5 each)", range="(0, inf)", item=float),
    },
    "partition": {
        "name": _f(str, "iid", "partition family (docs/setting.md#partitions)",
                   ("iid", "dirichlet", "dominant_label", "sharding", "exdir", "labelwise",
                    "distribution", "flower_dirichlet", "flower_shard", "flower_iid",
                    "natural")),
        "num_clients": _f(int, 10, "clients K", range="[1, 100000]"),
        "seed": _f(int, -1, "seed of the partition draw: -1 = each run's own seed (a draw "
                   "per seed); >= 0 = this one draw for every seed (the Hydra authors' "
                   "code: 2020)", range=f"[-1, {INT32_MAX}]"),
        "train_size": _f(float, 1.0, "the fraction of each client's samples it trains "
                         "on, kept as Hugging Face's train_test_split(train_size, "
                         "seed=train_split_seed) keeps it (jsfl.partitions.train_split): "
                         "the Hydra authors' Flower paths keep 0.8 (0.9 on CIFAR-100); "
                         "1 = all of them", range="(0, 1]"),
        "train_split_seed": _f(int, 42, "seed of train_size's permutation (the same for "
                               "every client, as the authors' code)",
                               range=f"[0, {INT32_MAX}]"),
    },
    "model": {
        "name": _f(str, "small_cnn", "model, by its registered name: docs/models.md lists "
                   "jsfl's; jsfl.models.register adds one"),
        "cut": _f(int, -1, "part-1 / part-2 cut index; -1 = the model's default",
                 range="[-1, inf)"),
        "norm": _f(str, "", "normalisation; '' = the model's default",
                   ("", "batch", "group", "none")),
        "init": _f(str, "torch", "layer initialisation: torch = PyTorch's defaults (weights "
                   "and biases uniform in +-1/sqrt(fan_in), what the papers' code runs unless a "
                   "model initialises itself); "
                   "he_lecun = He-normal convolutions, LeCun-normal dense layers, zero "
                   "biases; he_fan_out = convolution kernels He-normal over fan-out (the "
                   "MultiSFL authors' ResNet-18), the rest as torch",
                   ("torch", "he_lecun", "he_fan_out")),
        "conv_impl": _f(str, "auto", "dense conv lowering", ("auto", "xla", "im2col")),
        "eval_conv_impl": _f(str, "auto", "dense conv lowering of evaluation forwards; auto "
                             "= per layer, the backend's measured faster forward "
                             "(jsfl.models.layers.inference_conv_impl); same = conv_impl",
                             ("auto", "same", "xla", "im2col")),
        "depthwise_impl": _f(str, "auto", "depthwise conv lowering", ("auto", "grouped", "shifts")),
        "im2col_grad": _f(str, "auto", "kernel gradient of im2col convolutions: patches = "
                          "one matmul with the patch matrix built again (auto on the CPU: "
                          "1.3-1.6x the rate); taps = a product per kernel tap, never holding "
                          "the patch matrix (auto elsewhere: memory)",
                          ("auto", "patches", "taps")),
        "im2col_narrow": _f(str, "auto", "im2col convolutions over one input channel: "
                            "stacked = the shifted views stacked tap-major and one matmul "
                            "over the taps (auto on the CPU: Fashion-MNIST rounds 1.2-1.3x "
                            "faster); patches = the channel-minor patch matrix as for "
                            "wider inputs (auto elsewhere)", ("auto", "stacked", "patches")),
        "padding": _f(str, "torch", "padding of the convolutions: torch = PyTorch's "
                      "kernel // 2 on every side (what the papers' models compute); same "
                      "= XLA's SAME (differs at stride 2 on an even size)", ("torch", "same")),
    },
    "method": {
        "name": _f(str, "sfl", "method", tuple(METHODS)),
        "order": _f(str, "random", "server processing order",
                    ("random", "cyclic", "cyclic_reverse", "fixed")),
        "order_rule": _f(str, "authors", "how the order meets the batches: authors = the "
                         "Hydra authors' server queue (random: a uniformly random client "
                         "with batches left at every server step; cyclic: "
                         "batches_per_turn batches per client turn); steps = the paper's "
                         "batch steps (every client's batch t in step t's order; random: "
                         "a fresh permutation per step)", ("authors", "steps")),
        "cycle": _f(str, "label", "what a cyclic order cycles through, drawn once per run: "
                    "label = a random order of the labels, each client at its dominant "
                    "label's place (ties by id; the paper's reading); client = a random "
                    "order of the clients (the Hydra authors' code)", ("label", "client")),
        "batches_per_turn": _f(int, 1, "cyclic orders under order_rule = authors: batches "
                               "of one client the server takes in a row (the authors' "
                               "phi)", range="[1, 100000]"),
        "clients_per_round": _f(int, 0, "participants n per round; 0 = all K",
                                range="[0, inf)"),
        "local_epochs": _f(int, 1, "local epochs E per round", range="[1, 1000]"),
        "batch_size": _f(int, 64, "batch size B", range="[1, 65536]"),
        "drop_last": _f(bool, False, "leave out every client's last partial batch of an "
                        "epoch (PyTorch's DataLoader drop_last; the Hydra authors' code "
                        "drops it on their own partitions, keeps it on Flower's)"),
        "shuffle": _f(bool, True, "reshuffle every client's samples each epoch; false = "
                      "batches in the order the client holds its samples, the same "
                      "every epoch (PyTorch's DataLoader without shuffle: the Hydra "
                      "authors' Flower paths, whose order is Flower's and train_size's)"),
        "aggregation": _f(str, "samples", "weights of the round-end mean of the clients' "
                          "portions (FedAvg and its parallel variants; part-1 of SFL, "
                          "its variants, SplitFedV1, Hydra and MergeSFL; SplitFedV1's "
                          "part-2 copies; MultiHead's body): samples = each client's "
                          "sample count (FedAvg's, the MultiSFL authors' code); uniform = "
                          "1 per client (every Hydra authors' script); methods without "
                          "such a mean keep their own rule (docs/setting.md#aggregation)",
                          ("samples", "uniform")),
    },
    "optim": {
        "name": _f(str, "sgd", "optimiser, built once per run as an optax chain "
                   "(jsfl.core.optim.make_optimizer): sgd = SGD as the papers' PyTorch "
                   "code runs it (weight decay added to the gradient before momentum); "
                   "adam = Adam (b1 = momentum when > 0), weight decay added likewise",
                   ("sgd", "adam")),
        "lr": _f(float, 0.05, "learning rate", range="(0, inf)", batchable=True),
        "lr_decay": _f(float, 1.0, "multiplied into lr once per round", range="(0, 1]",
                       batchable=True),
        "lr_min": _f(float, 0.0, "floor of the decayed lr", range="[0, inf)",
                     batchable=True),
        "lr_decay_start": _f(int, 1, "first round (0-based) whose lr is decayed: round r "
                             "trains at lr * lr_decay^max(r - start + 1, 0)",
                             range="[1, 1000000]"),
        "momentum": _f(float, 0.0, "SGD momentum", range="[0, 1)"),
        "weight_decay": _f(float, 0.0, "SGD weight decay (PyTorch semantics)",
                           range="[0, inf)"),
        "clip_norm": _f(float, 0.0, "clip each step's gradient to this 2-norm before the "
                        "weight decay (PyTorch's clip_grad_norm_; FedSeq's authors' code "
                        "clips at 50); 0 = no clipping", range="[0, inf)"),
        "weight_decay_scope": _f(str, "all", "which parameters weight_decay moves: all = "
                                 "every portion; part2 = only the server's part-2 (Hydra: "
                                 "part-2a and the heads), the clients' part-1 undecayed "
                                 "(split methods; Hydra App. H.5, Fig. 19)",
                                 ("all", "part2")),
    },
    "exec": {
        "client_exec": _f(str, "auto", "how the clients' portions run in one program; auto "
                          "= the backend's default "
                          "(jsfl.train.programs.default_client_exec; its measurements: "
                          "benchmarks/README.md)",
                          ("auto", "vmap", "map", "unroll")),
        "seed_exec": _f(str, "auto", "how the seed axis runs in one program; auto = the "
                        "backend's default (jsfl.train.programs.default_seed_exec; its "
                        "measurements: benchmarks/README.md)",
                        ("auto", "vmap", "map")),
        "client_pass": _f(str, "auto", "where a sequential server's participants run "
                          "part-1 (SFL, Hydra and their variants): per_visit = forward, "
                          "backward and step inside the server's visit of each, one "
                          "participant's activations live at a time; batched = every "
                          "participant's forward side by side before the visits, all "
                          "their activations live through the segment; the same values; "
                          "auto = per_visit (jsfl.train.programs.default_client_pass)",
                          ("auto", "per_visit", "batched")),
        "precision": _f(str, "float32", "compute type of training: bfloat16 = matmuls and "
                        "activations in bfloat16 from float32 parameters (BatchNorm "
                        "statistics, optimiser state, loss and evaluation stay float32); "
                        "float32 is what the papers' code computes (docs/performance.md)",
                        ("float32", "bfloat16")),
        "server_unroll": _f(int, 1, "unroll factor of the server lax.scan",
                            range="[1, 1024]"),
        "mesh": _f(str, "auto", "device mesh 'seeds=S,clients=C' (jsfl.core.sharding); "
                   "auto = the devices that divide run.seeds, then the clients per round"),
        "eval_batch": _f(int, 0, "test samples per evaluation chunk; 0 = the measured "
                         "default of the backend (jsfl.train.evaluate.default_eval_batch)",
                         range="[0, 1000000]"),
        "progress": _f(bool, True, "a progress line on stderr: round, accuracy, samples/s "
                        "and the time left at the pace since the first round"),
        "compile_cache": _f(str, "auto", "persistent XLA compilation cache: auto = "
                            "$JSFL_COMPILE_CACHE, else $JAX_COMPILATION_CACHE_DIR, else "
                            "$XDG_CACHE_HOME/jsfl/xla (~/.cache/jsfl/xla); off; or a "
                            "directory"),
        "max_slots": _f(int, 0, "most slots (seeds, runs) one call of the round program "
                        "trains: jsfl run calls it on chunks of the slots, jsfl sweep cuts "
                        "its programs; 0 = as many as the device's memory holds (jsfl run: "
                        "XLA's memory analysis of the compiled round, jsfl.train.fit; jsfl "
                        "sweep: an estimate first, jsfl.train.memory.fitting_slots)",
                        range="[0, 1000000]"),
    },
}


def defaults() -> dict[str, dict[str, Any]]:
  # list defaults are copied: a config is edited in place while it is resolved
  return {s: {k: list(v.default) if isinstance(v.default, list) else v.default
              for k, v in fields.items()} for s, fields in SCHEMA.items()}


def _check_value(where: str, value, field: Option):
  return check(where, value, field, ConfigError)


def _unknown(where: str, key: str, allowed) -> ConfigError:
  near = difflib.get_close_matches(key, list(allowed), n=1)
  hint = f" (did you mean {near[0]!r}?)" if near else ""
  return ConfigError(f"unknown config key {where!r}{hint}; allowed: "
                     + ", ".join(sorted(allowed)))


def parse_override(text: str) -> tuple[str, str, Any]:
  """``section.key=value`` -> (section, key, value); value parsed as TOML."""
  def malformed(what: str) -> ConfigError:
    return ConfigError(f"override {text!r} {what}; allowed: section.key=value "
                       f"with section one of {', '.join(SCHEMA)} "
                       f"(e.g. method.order=cyclic)")

  if "=" not in text:
    raise malformed("has no '='")
  lhs, raw = text.split("=", 1)
  if "." not in lhs:
    raise malformed(f"names no section ({lhs.strip()!r} has no '.')")
  section, key = lhs.strip().split(".", 1)
  if not section.strip():
    raise malformed("names no section (nothing before the '.')")
  if not key.strip():
    raise malformed(f"names no key (nothing after {section.strip() + '.'!r})")
  try:
    value = tomllib.loads(f"v = {raw}")["v"]
  except tomllib.TOMLDecodeError:
    value = raw
  return section.strip(), key.strip(), value


def read_toml(path: str) -> dict:
  """A TOML file as a dict; anything that is not readable TOML text is a
  :class:`ConfigError` naming the file."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    raise ConfigError(f"config file {path!r} does not exist") from None
  except IsADirectoryError:
    raise ConfigError(f"config file {path!r} is a directory; allowed: a TOML "
                      "file") from None
  except OSError as e:
    raise ConfigError(f"config file {path!r} cannot be read: "
                      f"{e.strerror or e}") from None
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    kind = " (gzip-compressed)" if data[:2] == b"\x1f\x8b" else ""
    raise ConfigError(f"config file {path!r} is not UTF-8 text{kind}: byte "
                      f"{data[e.start]:#04x} at offset {e.start}; allowed: a "
                      "TOML file in UTF-8") from None
  try:
    return tomllib.loads(text)
  except tomllib.TOMLDecodeError as e:
    raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None


def load_config(path: str | None = None, overrides: Sequence[str] = ()) -> dict:
  """Reads, merges, and validates a config.

  Args:
    path: a TOML file, or None for the defaults.
    overrides: ``section.key=value`` strings applied after the file.

  Returns:
    The fully resolved config (every section, every known key).

  Raises:
    ConfigError: naming the first bad key, type or value.
  """
  raw = read_toml(path) if path else {}
  raw = copy.deepcopy(raw)
  for o in overrides:
    s, k, v = parse_override(o)
    raw.setdefault(s, {})
    if not isinstance(raw[s], dict):
      raise ConfigError(f"config section {s!r} must be a table")
    raw[s][k] = v
  return resolve(raw)


# model.padding arrived after runs were written with XLA's SAME everywhere:
# on these models (a stride-2 3x3 convolution over an even size) "same" is
# what a stored config without the key ran; on the others both conventions
# compute the same function, so the default stands for them.
PADDING_SENSITIVE_MODELS = ("mobilenet_v1", "mobilenet_v2", "resnet18")


def as_it_ran(stored: dict) -> dict:
  """A stored config (config.json's ``config``) with the keys added since it
  was written set to what its run computed: where the new default differs
  (:data:`PADDING_SENSITIVE_MODELS`; a self-balancing Dirichlet
  partition's ``cap_rule``, "exceeded" before the option), and where a
  config asking for something else must not match it (``optim.clip_norm``:
  a run from before the key clipped nothing); a copy, the input is left as
  it is."""
  stored = copy.deepcopy(stored)
  model = stored.get("model")
  if (isinstance(model, dict) and "padding" not in model
      and model.get("name", SCHEMA["model"]["name"].default) in PADDING_SENSITIVE_MODELS):
    model["padding"] = "same"
  optim = stored.get("optim")
  if isinstance(optim, dict) and "clip_norm" not in optim:
    optim["clip_norm"] = 0.0
  part = stored.get("partition")
  if isinstance(part, dict) and _self_balancing_dirichlet(part) and "cap_rule" not in part:
    part["cap_rule"] = "exceeded"
  return stored


def _self_balancing_dirichlet(part: dict) -> bool:
  return (part.get("self_balancing") is True
          and part.get("name", SCHEMA["partition"]["name"].default) == "dirichlet")


def _pin_changed_defaults(cfg: dict) -> None:
  """Owner options whose default changed, written into the resolved config
  (so into every new ``config.json``), so that :func:`as_it_ran` tells a run
  of the new default from one written before the option existed: the
  self-balancing Dirichlet's ``cap_rule`` (the MultiSFL authors' "reached"
  since 2026-11-29, "exceeded" before)."""
  part = cfg["partition"]
  if _self_balancing_dirichlet(part):
    part.setdefault("cap_rule", "reached")


def resolve(raw: dict) -> dict:
  """Defaults filled in and every key, type, value and range checked: the
  one validation ``jsfl run``, ``jsfl sweep`` and ``jsfl run --resume`` (on the
  stored ``config.json``) share.

  Raises:
    ConfigError: naming the first bad key, type or value.
  """
  if not isinstance(raw, dict):
    raise ConfigError(f"a config is a table of sections; got {type(raw).__name__}")
  cfg = defaults()
  for section, values in raw.items():
    if section not in SCHEMA:
      raise _unknown(section, section, SCHEMA)
    if not isinstance(values, dict):
      raise ConfigError(f"config section {section!r} must be a table, got {values!r}")
    for key, value in values.items():
      where = f"{section}.{key}"
      if key in SCHEMA[section]:
        cfg[section][key] = _check_value(where, value, SCHEMA[section][key])
      elif section in OPEN_SECTIONS:
        cfg[section][key] = _check_open(where, value)  # owner validates the rest
      else:
        raise _unknown(where, key, SCHEMA[section])
  _check_ranges(cfg)
  _check_method_options(cfg)
  _pin_changed_defaults(cfg)
  return cfg


def _check_open(where: str, value):
  """Owner options (dataset, partition, model) are numbers, strings or bools;
  non-finite floats and ints beyond int32 are never meaningful there."""
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{where}={value!r}; allowed: a finite number")
  if (isinstance(value, int) and not isinstance(value, bool)
      and not -INT32_MAX - 1 <= value <= INT32_MAX):
    raise ConfigError(f"{where}={value!r}; allowed: an int in int32 range")
  if isinstance(value, list):  # e.g. dataset.input_shape = [8, 8, 1]
    for v in value:
      if isinstance(v, (list, dict)):
        raise ConfigError(f"{where}={value!r}: wrong type; allowed: a flat list")
      _check_open(where, v)
    return value
  if isinstance(value, dict):
    raise ConfigError(f"{where}={value!r}: wrong type; allowed: a number, string, "
                      "true/false or a list of them")
  return value


def method_options(name: str) -> dict[str, Option]:
  """The ``[method]`` keys that only method ``name`` reads, as Options (its
  option set, listed in ``jsfl.methods.catalog``)."""
  return METHODS[name].options


def _check_method_options(cfg):
  """Method-specific keys of [method] against the method's option set."""
  options = method_options(cfg["method"]["name"])
  for key in extra_options(cfg, "method"):
    if key not in options:
      raise _unknown(f"method.{key}", key, set(SCHEMA["method"]) | set(options))
    cfg["method"][key] = _check_value(f"method.{key}", cfg["method"][key], options[key])
  for key, opt in options.items():
    cfg["method"].setdefault(key, opt.default)


def _check_ranges(cfg):
  """Checks between keys (each key's own range is in SCHEMA)."""
  n, k = cfg["method"]["clients_per_round"], cfg["partition"]["num_clients"]
  if not 0 <= n <= k:
    raise ConfigError(f"method.clients_per_round={n!r}; allowed: 0 (all) or an "
                      f"int in [1, partition.num_clients={k}]")
  me = cfg["method"]
  if me["batches_per_turn"] > 1 and me["order_rule"] != "authors":
    raise ConfigError(f"method.batches_per_turn={me['batches_per_turn']!r} with "
                      f"method.order_rule={me['order_rule']!r}; allowed: 1, or "
                      "order_rule = 'authors' (the steps rule serves one batch per step)")
  prof, R = cfg["run"]["profile"], cfg["run"]["rounds"]
  if prof and not (len(prof) == 2 and prof[0] <= prof[1] <= R):
    raise ConfigError(f"run.profile={prof!r}; allowed: [] or [first, last] with "
                      f"1 <= first <= last <= run.rounds={R}")
  rec = cfg["run"]["step_confusion_rounds"]
  if any(r > R for r in rec) or len(set(rec)) != len(rec):
    raise ConfigError(f"run.step_confusion_rounds={rec!r}; allowed: distinct rounds in "
                      f"[1, run.rounds={R}] ([] = the last round)")
  if len(set(cfg["run"]["trackers"])) != len(cfg["run"]["trackers"]):
    raise ConfigError(f"run.trackers={cfg['run']['trackers']!r}; allowed: each tracker once")
  seed, seeds = cfg["run"]["seed"], cfg["run"]["seeds"]
  if seed + seeds - 1 > INT32_MAX:
    raise ConfigError(f"run.seed={seed!r} with run.seeds={seeds}; allowed: run.seed + "
                      f"run.seeds - 1 <= {INT32_MAX}")


def extra_options(cfg: dict, section: str) -> dict:
  """The keys of an open section that are not in its schema (owner options)."""
  return {k: v for k, v in cfg[section].items() if k not in SCHEMA[section]}


HEADER = "| key | type | default | allowed | batchable | meaning |"
RULE = "| --- | --- | --- | --- | --- | --- |"


def markdown_reference() -> str:
  """The config reference as markdown, generated from :data:`SCHEMA`."""
  lines = ["# Config reference", "",
           "Generated from `jsfl.config.SCHEMA` (`python -m jsfl.config`).", "",
           ("*batchable*: a scalar that only enters a round's arithmetic, so runs "
            "that differ in it could share one compiled program; every other key "
            "is static (it changes the program: shapes, choices, counts, switches)."),
           ""]
  for section, fields in SCHEMA.items():
    lines += [f"## [{section}]", "", HEADER, RULE]
    for k, opt in fields.items():
      lines.append(_reference_row(k, opt))
    if section in OPEN_SECTIONS:
      lines += ["", (f"Other keys in `[{section}]` are passed as options to the "
                     f"chosen {section} and validated by it.")]
    lines.append("")
  return "\n".join(lines + _method_options_reference())


def _method_options_reference() -> list[str]:
  """One table per method with its own ``[method]`` keys (its option set)."""
  lines = ["## Method options", "",
           ("Keys under `[method]` that only one method reads (its option set in "
           "its module, listed in `jsfl/methods/catalog.py`), checked when "
           "`method.name` selects it."), ""]
  for name in METHODS:
    options = method_options(name)
    if not options:
      continue
    lines += [f"### `method.name = \"{name}\"`", "", HEADER, RULE]
    lines += [_reference_row(k, opt) for k, opt in options.items()]
    lines.append("")
  return lines


def _reference_row(key: str, opt: Option) -> str:
  if opt.choices:
    ok = ", ".join(f"`{c!r}`" for c in opt.choices)
    ok = f"items of {ok}" if opt.type is list else ok
  elif opt.type in (int, float) and opt.range:
    ok = f"`{opt.range}`"
  elif opt.type is list and opt.range:
    ok = f"items in `{opt.range}`"
  else:
    ok = ""
  batch = "yes" if opt.batchable else ""
  return (f"| `{key}` | {opt.type.__name__} | `{opt.default!r}` | {ok} | {batch} | "
          f"{opt.help} |")


TYPES_PATH = "jsfl/config_types.py"


def _class_name(section: str) -> str:
  return section.capitalize() + "Section"


def types_source() -> str:
  """The text of :data:`TYPES_PATH`: one frozen dataclass per section of
  :data:`SCHEMA` and :class:`Config` of them, so code reads a resolved
  config by attribute (``cfg.run.rounds``) and mypy checks every access."""
  lines = ['"""Typed sections of a resolved config, generated from',
           '``jsfl.config.SCHEMA`` by ``python -m jsfl.config --write-types`` (a test',
           'fails while it is stale; do not edit by hand).',
           '',
           ':func:`jsfl.config.typed` builds a :class:`Config` from a resolved config',
           "(the dict ``config.json`` stores); an open section's other keys (options",
           "of the dataset, partition, model or method) are its ``extra``.",
           '"""', '', 'from __future__ import annotations', '', 'import dataclasses',
           'from typing import Any', '']
  for section, fields in SCHEMA.items():
    lines += ['', '@dataclasses.dataclass(frozen=True)', f'class {_class_name(section)}:',
              f'  """``[{section}]`` (docs/config.md)."""', '']
    for k, opt in fields.items():
      typ = opt.type.__name__ if opt.type is not list else f"list[{opt.item.__name__}]"
      lines.append(f"  {k}: {typ}")
    if section in OPEN_SECTIONS:
      lines.append("  extra: dict[str, Any]  # the section's other keys")
    lines.append('')
  lines += ['', '@dataclasses.dataclass(frozen=True)', 'class Config:',
            '  """A resolved config, section by section."""', '']
  lines += [f"  {section}: {_class_name(section)}" for section in SCHEMA]
  lines += ['', '', 'SECTIONS: dict[str, type] = {']
  lines += [f'    "{section}": {_class_name(section)},' for section in SCHEMA]
  lines += ['}', '']
  return "\n".join(lines)


def typed(cfg: dict) -> config_types.Config:
  """The typed view of a resolved config (:class:`jsfl.config_types.Config`)."""
  t = config_types
  sections = {}
  for section, cls in t.SECTIONS.items():
    values = cfg[section]
    known = {k: values[k] for k in SCHEMA[section]}
    if section in OPEN_SECTIONS:
      known["extra"] = {k: v for k, v in values.items() if k not in SCHEMA[section]}
    sections[section] = cls(**known)
  return t.Config(**sections)


if __name__ == "__main__":
  import sys
  if sys.argv[1:] == ["--write-types"]:
    with open(TYPES_PATH, "w") as f:
      f.write(types_source())
  else:
    print(markdown_reference())
