"""What the round loop writes and keeps: ``metrics.jsonl`` records, the
running tally a resume restores, and ``summary.json``.

A record is one evaluated round of one slot (its seed, and its cell in a
program of several); ``docs/run-directory.md`` lists every key.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from jsfl import config as config_lib
from jsfl import metrics, rundir

# What every round returns; any other metric a method returns is a logged
# decision (Hydra's head batches, SFedKD's teachers), written per record.
BASE_METRICS = ("loss", "samples", "clients", "bytes_up", "bytes_down", "finite")
EMPTY_FIGURE: dict[str, Any] = {"median": None, "std": None, "per_seed": [], "seeds": []}


def warn(msg: str) -> None:
  print(f"jsfl: warning: {msg}", file=sys.stderr, flush=True)


def record_id(rec: dict) -> tuple:
  """``(cell, seed)`` of a record (cell None in a single-config run)."""
  return rec.get("cell"), rec["seed"]


def slot_name(cell, seed) -> str:
  return str(seed) if cell is None else f"{seed} of cell {cell}"


def round_lr(o: dict, r: int) -> float:
  """The learning rate slot config ``o`` (its ``[optim]``) trains round ``r`` at."""
  steps = max(r - o["lr_decay_start"] + 1, 0)
  return float(max(o["lr"] * o["lr_decay"] ** steps, o["lr_min"]))


def round_record(cfg, exp, state, m, e, i, r, history, wall, traffic) -> dict:
  """Slot ``i``'s ``metrics.jsonl`` record of round ``r`` (0-based): the
  evaluation ``e``, the round's metrics ``m``, and the metrics built from
  the slot's per-label ``history`` (appended to here)."""
  setup, slot = exp.setup, exp.slots[i]
  pla = np.asarray(e["per_label_accuracy"][i])
  present = np.asarray(e["present"][i])
  history.append(pla)
  up, down, cum_up, cum_down = traffic
  rec = {
      "round": r + 1, "seed": slot.seed, "method": config_lib.typed(cfg).method.name,
      "accuracy": float(e["accuracy"][i]), "loss": float(e["loss"][i]),
      "per_label_accuracy": pla,
      "pg": float(metrics.performance_gap(pla, present)),
      "bw": metrics.backward_transfer(np.stack(history), present),
      "train_loss": float(m["loss"][i]),
      "bytes_up": up, "bytes_down": down,
      "bytes_up_total": cum_up, "bytes_down_total": cum_down,
      "samples": int(m["samples"][i]), "wall_s": wall,
      "lr": round_lr(slot.cfg["optim"], r),  # the slot's own schedule
      "clients": m["clients"][i],
  }
  if slot.cell is not None:  # one of several cells of a program
    rec["cell"] = slot.cell
  rec.update({k: v[i] for k, v in m.items() if k not in BASE_METRICS})
  if setup.order in ("cyclic", "cyclic_reverse") and exp.method.label_rank is not None:
    label_order = np.argsort(np.asarray(exp.method.label_rank(state)[i]))
    if setup.cycle == "client":  # the cycle ranks clients: their labels' order
      label_order = metrics.cycle_label_order(label_order, exp.partitions[i]["dominant"],
                                              setup.num_classes)
    rec["label_order"] = label_order
    rec["per_position_accuracy"] = metrics.per_position_accuracy(pla, label_order)
  return rec


def summary(cfg, records, diverged=None) -> dict:
  """summary.json: its documented shape whatever happened (a metric without
  values, e.g. BW after one evaluation, is an empty figure, not null); the
  figures leave out slots that diverged, which ``diverged`` names
  (``{seed: round}``, or ``{(cell, seed): round}`` for a program of cells)."""
  diverged = {(k if isinstance(k, tuple) else (None, k)): r
              for k, r in (diverged or {}).items()}
  live = [r for r in records if record_id(r) not in diverged]

  def figures(recs):
    return {"seeds": sorted({r["seed"] for r in recs}),
            **{k: v if v is not None else dict(EMPTY_FIGURE)
               for k, v in metrics.summarize(recs).items()}}
  cells = list(dict.fromkeys(r["cell"] for r in records if "cell" in r))
  return {"method": config_lib.typed(cfg).method.name,
          "rounds_evaluated": max((r["round"] for r in records), default=0),
          # A program of several cells: a summary per cell (pooling them would
          # mix learning rates and partitions).
          **({"cells": {c: figures([r for r in live if r.get("cell") == c]) for c in cells}}
             if cells else figures(live)),
          "diverged": [{"seed": s, "round": r, **({"cell": c} if c is not None else {})}
                       for (c, s), r in sorted(diverged.items(),
                                               key=lambda it: (it[0][0] or "", it[0][1]))]}


def resume_records(cfg: dict, out: str, done: int, diverged: dict) -> list[dict]:
  """The records of rounds <= ``done`` (metrics.jsonl truncated to them), with
  summary.json made to match."""
  records = rundir.truncate_metrics(f"{out}/metrics.jsonl", done)
  if records:
    rundir.write_json_atomic(f"{out}/summary.json", summary(cfg, records, diverged))
  elif os.path.exists(f"{out}/summary.json"):
    os.remove(f"{out}/summary.json")
  return records


class Tally:
  """What the round loop accumulates across rounds (and restores on resume):
  the first round to run, cumulative bytes, the records written, per-slot
  per-label histories (for BW), and the slots that diverged (by index; a
  slot is named by its seed, and by its cell in a program of several)."""

  def __init__(self, exp):
    self.seeds = exp.seeds
    self.ids = [(s.cell, s.seed) for s in exp.slots]
    self.several = any(c is not None for c, _ in self.ids)
    self.start, self.cum_up, self.cum_down, self.records = 0, 0, 0, []
    self.diverged: dict[int, int] = {}  # slot -> round its training stopped at
    self.history = [[] for _ in self.ids]
    self.last_acc = None

  def diverged_ids(self) -> dict:
    """``{seed: round}``, or ``{(cell, seed): round}`` in a program of
    several cells."""
    return {(self.ids[i] if self.several else self.ids[i][1]): r
            for i, r in sorted(self.diverged.items())}

  def host_record(self) -> dict:
    """The checkpoint's record of diverged slots (by seed when seeds name them)."""
    if self.several:
      return {"diverged_slots": {str(i): r for i, r in self.diverged.items()}}
    return {"diverged": {str(self.ids[i][1]): r for i, r in self.diverged.items()}}

  def restore(self, cfg, out, ckpt, state, writes):
    """The newest restorable checkpoint's state; the records up to it."""
    try:
      got = ckpt.restore(state, self.seeds, warn=warn if writes else None)
    except BaseException:
      ckpt.close()
      raise
    if got is not None:
      self.start, state, self.cum_up, self.cum_down = got
      host = ckpt.restored_host
      if "diverged_slots" in host:
        self.diverged = {int(k): int(v) for k, v in host["diverged_slots"].items()}
      else:
        by_seed = {int(k): int(v) for k, v in (host.get("diverged") or {}).items()}
        self.diverged = {i: by_seed[s] for i, (_, s) in enumerate(self.ids) if s in by_seed}
    self.records = (resume_records(cfg, out, self.start, self.diverged_ids()) if writes
                    else rundir.read_metrics_upto(f"{out}/metrics.jsonl", self.start))
    self.history = [[np.asarray([np.nan if v is None else v
                                 for v in rec["per_label_accuracy"]], np.float32)
                     for rec in self.records if record_id(rec) == slot_id]
                    for slot_id in self.ids]
    return state

  def add_traffic(self, m):
    """Per slot (up, down, cumulative up, cumulative down) bytes of the round
    (every ``METHOD.round`` returns its own)."""
    ups, downs = tuple(map(float, m["bytes_up"])), tuple(map(float, m["bytes_down"]))
    self.cum_up += np.asarray(ups)
    self.cum_down += np.asarray(downs)
    return [(ups[i], downs[i], self.cum_up[i], self.cum_down[i])
            for i in range(len(self.ids))]

  def note_divergence(self, cfg, m, r, warn_now: bool) -> bool:
    """Marks slots whose round was not finite, or whose training loss
    exceeded ``run.divergence_loss`` (an exploding but finite loss is the
    same failure a step or two earlier); True if the run must stop.

    A program of several cells stops only when every slot has diverged: one
    cell's divergence must not end the others' runs (the sweep applies each
    cell's ``run.on_divergence`` to its own records when it splits them).
    """
    finite, loss = np.asarray(m["finite"]), np.asarray(m["loss"], np.float64)
    limit = config_lib.typed(cfg).run.divergence_loss
    exploded = (loss > limit) if limit > 0 else np.zeros_like(finite)
    newly = [i for i in range(len(self.ids)) if (not finite[i] or exploded[i])
             and i not in self.diverged]
    self.diverged.update({i: r + 1 for i in newly})
    if newly and warn_now:
      names = [slot_name(*self.ids[i]) for i in newly]
      why = ("non-finite loss or parameters" if not all(exploded[i] and finite[i]
                                                        for i in newly)
             else f"training loss {max(loss[i] for i in newly):.3g} above "
                  f"run.divergence_loss={limit:g}")
      warn(f"seed{'s' * (len(newly) > 1)} {', '.join(names)} diverged at "
           f"round {r + 1} ({why}); "
           + ("stopping the run" if config_lib.typed(cfg).run.on_divergence == "stop_run"
              and not self.several
              else f"{'their' if len(newly) > 1 else 'its'} later rounds are not recorded"))
    every = len(self.diverged) == len(self.ids)
    return bool(self.diverged) and (every or (config_lib.typed(cfg).run.on_divergence == "stop_run"
                                              and not self.several))

  def record(self, cfg, exp, state, m, e, r, wall, traffic, writer):
    """Writes the evaluated round's records; the median accuracy of the live
    slots (None if none is left)."""
    for i in range(len(self.ids)):
      if i in self.diverged:
        continue
      rec = round_record(cfg, exp, state, m, e, i, r, self.history[i], wall, traffic[i])
      writer.write(rec)
      self.records.append(rec)
    self.last_acc = e["accuracy"]
    live = [i for i in range(len(self.ids)) if i not in self.diverged]
    return float(np.median(e["accuracy"][live])) if live else None


STEP_CONFUSION = "confusion_steps.npz"
# its arrays with a slot axis: after the round axis, or alone
STEP_CONFUSION_PER_ROUND = ("confusion", "labels", "steps")
STEP_CONFUSION_SLOTS = ("seed", "cell")


def write_step_confusion(out: str, exp, r: int, sc: dict) -> str:
  """Adds round ``r``'s (0-based) step confusion matrices (``run.step_confusion``;
  ``sc`` the step program's third output, fetched) to ``out/confusion_steps.npz``,
  replacing what an earlier attempt of the round (a resumed run) wrote.

  The file's arrays (docs/run-directory.md): ``round`` ``(R',)`` 1-based;
  ``seed`` ``(n,)`` and ``cell`` ``(n,)`` the slots; ``confusion``
  ``(R', n, S, L, L)`` counts, row = true label, column = predicted, after
  step s of the round (zeros past ``steps``); ``labels`` ``(R', n, S)`` the
  dominant label step s served (-1 past ``steps``); ``steps`` ``(R', n)``.
  """
  path = os.path.join(out, STEP_CONFUSION)
  fetched = (sc["confusion"], sc["labels"], sc["count"])
  new = {"round": np.array([r + 1]),
         **{k: np.asarray(v)[None].astype(np.int32)
            for k, v in zip(STEP_CONFUSION_PER_ROUND, fetched, strict=True)}}
  if os.path.exists(path):
    with np.load(path) as old:
      keep = old["round"] != r + 1
      if old["confusion"].shape[1:] == new["confusion"].shape[1:]:
        new = {k: np.concatenate([old[k][keep], v]) for k, v in new.items()}
  order = np.argsort(new["round"], kind="stable")
  arrays = {k: v[order] for k, v in new.items()}
  arrays.update(zip(STEP_CONFUSION_SLOTS, (np.array([s.seed for s in exp.slots]),
                                           np.array([s.cell or "" for s in exp.slots])),
                    strict=True))
  rundir.write_npz_atomic(path, arrays)
  return path


def cell_step_confusion(src: str, dst: str, cell: str) -> bool:
  """Writes the slots of ``cell`` of the program directory ``src``'s
  ``confusion_steps.npz`` into ``dst``'s (a sweep splitting a finished
  program into its cells); False when ``src`` has none or no slot of
  ``cell``."""
  path = os.path.join(src, STEP_CONFUSION)
  if not os.path.isfile(path):
    return False
  with np.load(path) as f:
    arrays = {k: f[k] for k in f.files}
  mine = arrays["cell"] == cell
  if not mine.any():
    return False
  out = {k: (v[:, mine] if k in STEP_CONFUSION_PER_ROUND
             else v[mine] if k in STEP_CONFUSION_SLOTS else v)
         for k, v in arrays.items()}
  rundir.write_npz_atomic(os.path.join(dst, STEP_CONFUSION), out)
  return True
