"""Per-round JSONL log for the adapted MultiSFL authors' code (our own module).

``adapt.py`` copies it into their clone and adds calls to it:

* ``tick(trainer, p=...)`` in each training loop's ``while`` condition,
  i.e. at the start of every round (and once more when the loop ends);
  MultiSFL passes its global ``SAMPLE_BUDGET``, the proportion p the round
  trains with;
* ``count(kind, n)`` where a batch goes forward (and then backward) through
  part-1: ``"main"`` for the client's own samples (MultiSFL, SFL; FedAvg's
  whole model), ``"helper"`` for MultiSFL's replayed helper samples (run
  through a copy of the branch's part-1 taken at the start of each epoch),
  ``"replay_pool"`` for the size of the helper samples MultiSFL draws for a
  branch each round (before the per-batch re-draw that ``"helper"`` counts);
* ``mark_eval()`` just before the test-set evaluation;
* ``record(trainer, **extra)`` at the start of the trainer's ``log()``
  (after the evaluation), which appends one JSON line to ``--round_log``.

Each record: ``round`` (1-based), ``algorithm``, ``seed``, ``accuracy`` (% on
the 10k test set, as the authors compute it), ``loss`` (test), ``max_avg``
(the authors' best 10-round moving average so far), ``samples`` (main
samples through part-1 this round, all epochs), ``helper_samples``,
``train_s`` (round start to evaluation start: training and aggregation, the
span jsfl's ``wall_s`` covers), ``eval_s``, ``round_s`` (both together),
``train_cpu_s`` (the process's CPU time over ``train_s``: unlike wall time it
does not grow when the process waits for a core or is stopped), and
for MultiSFL ``p`` (used this round), ``p_next`` (after their budget
adjustment), ``replay_requested`` (sum over branches of their
``overall_requirement``) and ``replay_pool`` (helper samples drawn).
"""

from __future__ import annotations

import json
import time

_S = {"t0": None, "eval": None, "c0": None, "ceval": None,
      "counts": {"main": 0, "helper": 0}, "p": None, "helper_overhead": None}


def tick(trainer, p=None) -> bool:
  """Starts a round's clock and counters; always True (used in a while)."""
  _S.update(t0=time.perf_counter(), c0=time.process_time(), eval=None, ceval=None,
            counts={"main": 0, "helper": 0}, p=p,
            helper_overhead=getattr(trainer, "helper_overhead", None))
  return True


def count(kind: str, n: int) -> None:
  _S["counts"][kind] = _S["counts"].get(kind, 0) + int(n)


def mark_eval() -> None:
  _S["eval"], _S["ceval"] = time.perf_counter(), time.process_time()


def record(trainer, **extra) -> None:
  now = time.perf_counter()
  t0 = _S["t0"] if _S["t0"] is not None else now
  ev = _S["eval"] if _S["eval"] is not None else now
  c0 = _S["c0"] if _S["c0"] is not None else time.process_time()
  cev = _S["ceval"] if _S["ceval"] is not None else time.process_time()
  args = trainer.args
  rec = {"round": int(trainer.round) + 1, "algorithm": args.algorithm,
         "seed": int(args.seed), "accuracy": float(trainer.acc),
         "loss": float(trainer.loss), "max_avg": float(trainer.max_avg),
         "samples": _S["counts"]["main"], "helper_samples": _S["counts"]["helper"],
         "train_s": ev - t0, "eval_s": now - ev, "round_s": now - t0,
         "train_cpu_s": cev - c0}
  for k, v in _S["counts"].items():
    if k not in ("main", "helper"):
      rec[k] = v
  if _S["p"] is not None:
    rec["p"] = float(_S["p"])
  if _S["helper_overhead"] is not None:
    rec["replay_requested"] = int(trainer.helper_overhead - _S["helper_overhead"])
  rec.update({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in extra.items()})
  path = getattr(args, "round_log", None)
  if path:
    with open(path, "a") as f:
      f.write(json.dumps(rec) + "\n")
  print("ROUNDLOG " + json.dumps(rec), flush=True)
