"""Timing variants in worker processes, interleaved: what the benchmarks share.

Every variant a benchmark compares (jsfl vs the torch loop, or the points of
a scaling curve) runs in a worker process of its own, so its compile time and
peak memory (a process's RSS, a device's peak) are its own.  A worker builds
its variant, makes the first (compiling / warming) call, reports ``ready`` and
then times one call per ``time`` request; the parent sends the requests
round-robin (A, B, A, B, ...), so a load that changes over time hits every
variant alike, and reports medians.

Protocol (one line each way): the worker answers every request with a line
``@@ <json>`` on stdout (anything else it prints is ignored); requests are
``time`` -> ``{"round_s"}``, ``stats`` -> ``{"memory"}``, ``quit``.

No jax or torch import here: the torch worker (``torch_loop.py --serve``)
must not pay for jax, nor the jsfl worker for torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)

REPLY = "@@ "


# ------------------------------------------------------------ worker side
def rss_peak_bytes() -> int:
  """This process's peak resident set size (``VmHWM``, else ``ru_maxrss``)."""
  try:
    with open("/proc/self/status") as f:
      return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) * 1024
  except (OSError, AttributeError):
    # ru_maxrss is KiB on Linux (bytes on macOS, where this is only a fallback).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reply(obj: dict) -> None:
  print(REPLY + json.dumps(obj), flush=True)


def serve(call: Callable[[], None], ready: dict, memory: Callable[[], dict]) -> None:
  """The worker's loop: times ``call`` once, reports, then answers requests.

  Args:
    call: one timed unit (a round of every seed); must block until done.
    ready: what to report with the first call's time (``first_call_s`` is
      added), e.g. the compile time.
    memory: returns the worker's peak memory as a dict (``peak_bytes``,
      ``kind``).
  """
  t = time.perf_counter()
  call()
  reply(dict(ready, first_call_s=ready.get("compile_s", 0.0) + time.perf_counter() - t))
  for line in sys.stdin:
    cmd = line.strip()
    if cmd == "time":
      t = time.perf_counter()
      call()
      reply({"round_s": time.perf_counter() - t})
    elif cmd == "stats":
      reply({"memory": memory()})
    elif cmd == "quit":
      return


# ------------------------------------------------------------ parent side
class Worker:
  """A worker subprocess and its request / reply channel.

  Args:
    cmd: the command line (``[sys.executable, script, ...]``).
    env: its environment (None: this one's).
  """

  def __init__(self, cmd: list[str], env: dict | None = None):
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env)

  def reply(self) -> dict:
    """The next reply; an ``error`` dict if the worker ended instead."""
    for line in self.proc.stdout:
      if line.startswith(REPLY):
        return json.loads(line[len(REPLY):])
    return {"error": f"worker ended (exit code {self.proc.wait()})"}

  def request(self, cmd: str) -> dict:
    if self.proc.poll() is not None:
      return {"error": f"worker ended (exit code {self.proc.returncode})"}
    try:
      self.proc.stdin.write(cmd + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      return {"error": "worker ended"}
    return self.reply()

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
      except BrokenPipeError:
        pass
      self.proc.wait()


def time_round_robin(workers: dict, ready: dict, repeats: int, samples: dict) -> dict:
  """Times ready workers round-robin and collects their results.

  Args:
    workers: ``{name: Worker}``, each past its ``ready`` reply.
    ready: ``{name: ready reply}``; a reply with ``error`` is skipped.
    repeats: timed calls per worker.
    samples: ``{name: samples per call}``.

  Returns:
    ``{name: result}``: the ready reply plus ``round_s`` (median),
    ``round_s_all``, ``samples_per_s`` and ``memory``, or an ``error``.
    Every worker is closed.
  """
  out = {k: dict(v) for k, v in ready.items()}
  times = {k: [] for k in workers}
  for _ in range(repeats):
    for k, w in workers.items():
      if "error" in out[k]:
        continue
      r = w.request("time")
      if "error" in r:
        out[k]["error"] = r["error"]
      else:
        times[k].append(r["round_s"])
  for k, w in workers.items():
    if "error" not in out[k]:
      out[k].update(w.request("stats"))
      out[k]["round_s_all"] = times[k]
      out[k]["round_s"] = statistics.median(times[k])
      out[k]["samples_per_s"] = samples[k] / out[k]["round_s"]
    w.close()
  return out


def load_average() -> tuple:
  return tuple(round(v, 2) for v in os.getloadavg())


def write_results(res: dict, out: str, prefix: str, plot) -> str:
  """Writes ``res`` as ``OUT/PREFIX-<backend>-<host>-<time>.json`` and its
  plot as the matching ``.png``; returns the path stem."""
  import jax
  stem = _results.path(out, prefix, jax.default_backend(), _results.host(), ext="")
  _results.write_json(stem + ".json", res)
  plot(res, stem + ".png")
  _results.drop_partial(out, prefix)
  print(f"\nwrote {stem}.json and .png")
  return stem


def write_partial(res: dict, out: str, prefix: str) -> str:
  """Rewrites ``OUT/PREFIX-partial.json`` (atomically) with the rows so far, so
  a run stopped by a time limit keeps what it measured; the final
  :func:`write_results` removes it."""
  return _results.write_partial(out, prefix, res)


def add_run_args(ap: argparse.ArgumentParser, out: str) -> None:
  """The options every interleaved benchmark shares: ``--load-note``,
  ``--out`` (default ``out``) and the hidden ``--worker`` of its subprocesses."""
  ap.add_argument("--load-note", default="", help="free text on the machine's load")
  ap.add_argument("--out", default=out)
  ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
