"""What a JAX profiler trace says about a few rounds: where the device was
busy, where it waited, and on what.

``jax.profiler.start_trace(dir, create_perfetto_trace=True)`` writes a
Perfetto ``*.trace.json.gz``: one process per host and device
(``/host:CPU``, ``/device:GPU:0``), one thread ("lane") per executor thread
or GPU stream, complete events (``"ph": "X"``, microseconds) on each.  This
module reads one and reports, per round traced:

* every lane: its events, the time it was busy (overlapping events counted
  once), its costliest event names (numbered HLO names such as
  ``fusion.12`` keep their number: each is one op) and its costliest kinds
  (the names less that number: all ``fusion`` ops together);
* per device: the busy time of its streams (lanes named ``Stream ...``), as
  a fraction of the rounds' wall time when that is given, else of the
  traced window (what a launch-bound or synchronising program, or the host's
  work between programs, leaves idle), the kernels a round launches, and
  its memory copies (a device-to-host copy inside a round is a loop or
  branch condition read back by the host).

On the CPU the trace has no device process; the host lanes (the PjRt
client's executor threads) are the round's ops.

    python benchmarks/trace_summary.py RUN_DIR/profile/plugins/profile/*/*.trace.json.gz --rounds 2
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re


def load(path: str) -> dict:
  """The trace's JSON (gzip or plain)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return json.load(f)


def busy_us(intervals: list[tuple[float, float]]) -> float:
  """Total length of the union of ``(start, end)`` intervals."""
  total, end = 0.0, float("-inf")
  for s, e in sorted(intervals):
    if e <= end:
      continue
    total += e - max(s, end)
    end = e
  return total


def _names(events: list[dict]) -> tuple[dict, dict]:
  procs, threads = {}, {}
  for e in events:
    if e.get("ph") != "M":
      continue
    if e.get("name") == "process_name":
      procs[e["pid"]] = e["args"]["name"]
    elif e.get("name") == "thread_name":
      threads[(e["pid"], e["tid"])] = e["args"]["name"]
  return procs, threads


# a device process's lanes that annotate its streams rather than run on them
_ANNOTATIONS = ("XLA Modules", "XLA Ops", "Steps", "Source", "TensorFlow", "Framework",
                "Launch Stats", "XLA TraceMe")


def _stream_lanes(lanes: list[str]) -> list[str]:
  """A device's stream lanes: those named ``Stream ...``, else every lane
  that is not an annotation of them."""
  streams = [t for t in lanes if t.startswith("Stream")]
  return streams or [t for t in lanes if not t.startswith(_ANNOTATIONS)]


def kind(name: str) -> str:
  """An op's kind: its name less a trailing ``.N`` (``fusion.12`` and
  ``fusion.3`` are two ``fusion`` ops, ``cond.2.clone`` a ``cond``)."""
  return re.sub(r"(\.\d+)+(\.clone)?$|\.clone$", "", name)


def _is_copy(name: str) -> bool:
  return "memcpy" in name.lower()


def _device_to_host(name: str) -> bool:
  n = name.lower().replace(" ", "")
  return _is_copy(name) and ("dtoh" in n or "devicetohost" in n or "d2h" in n)


def summarize(trace: dict, rounds: int = 1, wall_s: float | None = None,
              top: int = 12, max_lanes: int = 10) -> dict:
  """Per-round figures of ``trace`` (:func:`load`), which covers ``rounds``
  rounds taking ``wall_s`` seconds on the host in all; the ``max_lanes``
  busiest lanes are listed."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  procs, threads = _names(events)
  lanes: dict[tuple, list[dict]] = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and "dur" in e:
      lanes[(e.get("pid"), e.get("tid"))].append(e)
  per = 1.0 / max(rounds, 1)
  # the traced span, less the profiler's own start and stop (a stop can take
  # longer than a round): what the busy fractions are of when the caller
  # gives no wall time
  own = [e for evs in lanes.values() for e in evs
         if "start_trace" not in e["name"] and "stop_trace" not in e["name"]]
  window = (max(e["ts"] + e["dur"] for e in own) - min(e["ts"] for e in own)) if own else 0.0
  denominator = wall_s * 1e6 if wall_s else window
  out_lanes = []
  busiest = sorted(lanes.items(), key=lambda kv: -sum(e["dur"] for e in kv[1]))[:max_lanes]
  for (pid, tid), evs in busiest:
    proc, thread = procs.get(pid, str(pid)), threads.get((pid, tid), str(tid))
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in evs]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in evs:
      by_name[e["name"]][0] += e["dur"]
      by_name[e["name"]][1] += 1
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    for n, (t, c) in by_name.items():
      by_kind[kind(n)][0] += t
      by_kind[kind(n)][1] += c

    def rows(table):
      return [{"name": n[:160], "ms_per_round": round(t * per / 1e3, 3),
               "count_per_round": round(c * per, 1)}
              for n, (t, c) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]]
    out_lanes.append({
        "process": proc, "thread": thread, "events_per_round": round(len(evs) * per, 1),
        "busy_ms_per_round": round(busy_us(spans) * per / 1e3, 3),
        "top": rows(by_name), "kinds": rows(by_kind)})
  device_lanes = collections.defaultdict(dict)
  for (pid, tid), evs in lanes.items():
    proc = procs.get(pid, str(pid))
    if proc.startswith("/device:"):
      device_lanes[proc][threads.get((pid, tid), str(tid))] = evs
  out_devices = []
  for proc, by_thread in device_lanes.items():
    used = _stream_lanes(sorted(by_thread))
    evs = [e for t in used for e in by_thread[t]]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in evs]
    copies = [e for e in evs if _is_copy(e["name"])]
    d2h = [e for e in copies if _device_to_host(e["name"])]
    kernels = [e for e in evs if not _is_copy(e["name"])]
    busy = busy_us(spans)
    row = {"device": proc, "streams": used, "busy_ms_per_round": round(busy * per / 1e3, 3),
           "kernels_per_round": round(len(kernels) * per, 1),
           "kernel_ms_per_round": round(sum(e["dur"] for e in kernels) * per / 1e3, 3),
           "median_kernel_us": (round(sorted(e["dur"] for e in kernels)[len(kernels) // 2], 2)
                                if kernels else None),
           "copies_per_round": round(len(copies) * per, 1),
           "device_to_host_copies_per_round": round(len(d2h) * per, 1)}
    if denominator:
      row["busy_fraction"] = round(busy / denominator, 4)
    out_devices.append(row)
  res = {"rounds": rounds, "fraction_of": "wall" if wall_s else "window",
         "window_ms_per_round": round(window * per / 1e3, 3),
         "lanes": out_lanes, "devices": out_devices}
  if wall_s:
    res["wall_ms_per_round"] = round(wall_s * 1e3 * per, 3)
  return res


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("trace", help="a *.trace.json.gz of jax.profiler")
  ap.add_argument("--rounds", type=int, default=1, help="rounds the trace covers")
  ap.add_argument("--wall-s", type=float, default=None, help="their host wall time")
  ap.add_argument("--top", type=int, default=12)
  args = ap.parse_args()
  print(json.dumps(summarize(load(args.trace), args.rounds, args.wall_s, args.top), indent=1))


if __name__ == "__main__":
  main()
