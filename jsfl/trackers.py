"""Experiment trackers beside ``metrics.jsonl``: TensorBoard, Weights & Biases,
MLflow (``run.trackers``; ``docs/trackers.md``).

``metrics.jsonl`` stays the record a run is resumed, reported and plotted
from; a tracker is a copy for the tools users already watch.  Each seed of a
run (each cell and seed of a sweep's program) is one tracker run, named
``<cell or run name>/seed<k>``, with its resolved config as hyperparameters
and every evaluated round's scalar figures at step = round.

A tracker whose package is missing, or that fails while it opens, writes or
closes, costs one warning line and is off for the rest of the run; it never
stops or changes the run.  Importable without JAX.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

TRACKERS = ("tensorboard", "wandb", "mlflow")
PACKAGE = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
NOT_FIGURES = ("round", "seed", "cell", "method")


def scalars(rec: dict) -> dict[str, float]:
  """A record's scalar figures (accuracy, loss, pg, bw, lr, bytes, ...): its
  int and float fields, without the keys that name the record."""
  return {k: float(v) for k, v in rec.items()
          if k not in NOT_FIGURES and isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat_config(cfg: dict) -> dict[str, Any]:
  """``{"section.key": value}``: the form hyperparameter tables show."""
  return {f"{s}.{k}": v for s, sec in cfg.items() if isinstance(sec, dict)
          for k, v in sec.items()}


@contextlib.contextmanager
def _quiet():
  """The trackers' own chatter (banners, deprecation notes, log lines) stays
  off the terminal: jsfl prints one line per problem."""
  out, err = io.StringIO(), io.StringIO()
  with warnings.catch_warnings(), contextlib.redirect_stdout(out), \
       contextlib.redirect_stderr(err):
    warnings.simplefilter("ignore")
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
      yield
    finally:
      logging.disable(previous)


class Slot:
  """One tracker run: a seed of a run, or a cell's seed in a program."""

  def __init__(self, cell: str | None, seed: int, cfg: dict, group: str, root: str,
               uid: str):
    self.cell, self.seed, self.cfg, self.group, self.root = cell, seed, cfg, group, root
    self.name = f"{cell or cfg['run']['name']}/seed{seed}"
    self.tags = [cfg["method"]["name"], cfg["dataset"]["name"], cfg["partition"]["name"],
                 cfg["model"]["name"]] + ([cell] if cell else [])
    # stable across a resume, so the tracker continues the same run
    self.uid = hashlib.sha1(f"{uid}|{cell}|{seed}".encode()).hexdigest()[:16]


class TensorBoard:
  """Event files under ``<root>/tensorboard/seed<k>``, written with
  tensorboard's own event writer (no TensorFlow needed)."""

  def __init__(self, slots: Sequence[Slot], start: int):
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    self.pb = event_pb2, summary_pb2
    self.writers = []
    for s in slots:
      w = EventFileWriter(os.path.join(s.root, "tensorboard", f"seed{s.seed}"))
      if start:  # TensorBoard drops what an interrupted run logged after its checkpoint
        w.add_event(event_pb2.Event(wall_time=time.time(), step=start + 1,
                                    session_log=event_pb2.SessionLog(
                                        status=event_pb2.SessionLog.START)))
      else:
        text = json.dumps(s.cfg, indent=1, default=str)
        meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()])
        w.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="config", metadata=meta, tensor=tensor)])))
      self.writers.append(w)

  def log(self, i: int, step: int, values: dict[str, float]) -> None:
    event_pb2, summary_pb2 = self.pb
    self.writers[i].add_event(event_pb2.Event(
        wall_time=time.time(), step=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])))

  def flush(self) -> None:
    for w in self.writers:
      w.flush()

  def close(self) -> None:
    for w in self.writers:
      w.close()


class WandB:
  """One W&B run per slot in ``<root>/wandb``; offline unless ``WANDB_MODE``
  says otherwise (``wandb sync`` uploads it later)."""

  def __init__(self, slots: Sequence[Slot], start: int):
    import wandb
    self.runs = []
    for s in slots:
      os.makedirs(s.root, exist_ok=True)
      self.runs.append(wandb.init(
          dir=s.root, mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
          project=os.environ.get("WANDB_PROJECT", "jsfl"), group=s.group, name=s.name,
          tags=s.tags, config=s.cfg, id=s.uid, resume="allow", reinit="create_new",
          settings=wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                  x_disable_machine_info=True, disable_git=True,
                                  save_code=False)))

  def log(self, i: int, step: int, values: dict[str, float]) -> None:
    self.runs[i].log({**values, "round": step}, step=step)

  def flush(self) -> None:
    pass

  def close(self) -> None:
    for r in self.runs:
      r.finish()


class MLflow:
  """One MLflow run per slot: the file store ``<root>/mlruns`` unless
  ``MLFLOW_TRACKING_URI`` names another store (a server, ``sqlite:///...``);
  a resumed run continues the MLflow run of its slot."""

  def __init__(self, slots: Sequence[Slot], start: int):
    # MLflow 3 keeps its file store (no database packages needed) behind a flag
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient
    self.clients, self.ids = [], []
    for s in slots:
      uri = os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.abspath(
          os.path.join(s.root, "mlruns"))
      client = MlflowClient(tracking_uri=uri)
      name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or s.group
      exp = client.get_experiment_by_name(name)
      exp_id = exp.experiment_id if exp else client.create_experiment(name)
      found = client.search_runs([exp_id], f"tags.`jsfl.slot` = '{s.uid}'")
      if found:
        run_id = found[0].info.run_id
      else:
        run_id = client.create_run(exp_id, run_name=s.name, tags={
            "jsfl.slot": s.uid, "jsfl.seed": str(s.seed), "jsfl.cell": s.cell or "",
            **{f"jsfl.tag.{t}": "" for t in s.tags}}).info.run_id
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flat_config(s.cfg).items()]
        for j in range(0, len(params), 100):  # MLflow's batch limit
          client.log_batch(run_id, params=params[j:j + 100])
      client.log_batch(run_id, tags=[RunTag("jsfl.resumed_at", str(start))] if start else [])
      self.clients.append(client)
      self.ids.append(run_id)

  def log(self, i: int, step: int, values: dict[str, float]) -> None:
    from mlflow.entities import Metric
    now = int(time.time() * 1000)
    self.clients[i].log_batch(self.ids[i], metrics=[Metric(k, v, now, step)
                                                    for k, v in values.items()])

  def flush(self) -> None:
    pass

  def close(self) -> None:
    for c, run_id in zip(self.clients, self.ids, strict=True):
      c.set_terminated(run_id)


BACKENDS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Trackers:
  """The run's trackers, opened at its first record (a run that fails
  before it leaves no tracker files), one tracker run per slot.

  Args:
    names: ``run.trackers``.
    slots: the run's slots, in record order.
    warn: prints one warning line.
    start: the round the run (re)starts after (0: a new run).
  """

  def __init__(self, names: Sequence[str], slots: Sequence[Slot], warn: Callable[[str], None],
               start: int = 0):
    self.names, self.slots, self.warn, self.start = list(names), list(slots), warn, start
    self.index = {(s.cell, s.seed): i for i, s in enumerate(self.slots)}
    self.live: dict[str, Any] | None = None

  def _open(self) -> dict[str, Any]:
    live = {}
    for name in self.names:
      try:
        with _quiet():
          live[name] = BACKENDS[name](self.slots, self.start)
      except ImportError:
        self.warn(f"run.trackers: {name} is not installed (pip install "
                  f"'{PACKAGE[name]}' or 'jsfl[{name}]'); the run goes on without it")
      except Exception as e:  # noqa: BLE001 - a tracker never stops a run
        self._failed(name, "opening", e)
    return live

  def _failed(self, name: str, doing: str, e: BaseException) -> None:
    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    self.warn(f"tracker {name} failed while {doing} ({type(e).__name__}: {msg}); it is off "
              "for the rest of the run, metrics.jsonl is unaffected")

  def _each(self, doing: str, fn: Callable[[Any], None]) -> None:
    for name in list(self.live or {}):
      try:
        with _quiet():
          fn(self.live[name])  # type: ignore[index]
      except Exception as e:  # noqa: BLE001
        self._failed(name, doing, e)
        self.live.pop(name, None)  # type: ignore[union-attr]

  def log(self, records: Sequence[dict]) -> None:
    """One evaluated round's records (one per live slot)."""
    if not self.names or not records:
      return
    if self.live is None:
      self.live = self._open()

    def write(t):
      for rec in records:
        t.log(self.index[(rec.get("cell"), rec["seed"])], rec["round"], scalars(rec))
      t.flush()
    self._each("writing", write)

  def close(self) -> None:
    if self.live:
      self._each("closing", lambda t: t.close())
    self.live = None
