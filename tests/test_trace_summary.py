"""``benchmarks/trace_summary.py``: the reading of a profiler trace that
``gpu.sh fill`` (``fill.py --profile``) leaves, on a trace shaped as JAX
writes one for a GPU (a device process with stream lanes and annotation
lanes) and on a real CPU trace."""

import glob
import gzip
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import load_script

ts = load_script("benchmarks/trace_summary.py")


def test_busy_counts_overlaps_once():
  assert ts.busy_us([]) == 0
  assert ts.busy_us([(0, 10), (5, 15), (20, 25)]) == 20  # [0, 15] and [20, 25]
  assert ts.busy_us([(0, 30), (5, 10), (12, 20)]) == 30  # nested
  assert ts.busy_us([(10, 20), (0, 5)]) == 15  # unsorted


def _gpu_trace():
  """Two rounds of a GPU trace: each 1,000 us of host wall; on the compute
  stream three kernels (100 + 300 + 100 us, the last overlapping a copy stream's
  device-to-host copy) and on the copy stream one 50 us copy; the XLA Ops
  lane repeats the kernels' span as ops, which must not count twice."""
  m = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
       {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}}]
  for tid, name in [(10, "Stream #13(Compute)"), (11, "Stream #14(MemcpyD2H)"),
                    (12, "XLA Ops"), (13, "XLA Modules")]:
    m.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}})
  m.append({"ph": "M", "pid": 2, "tid": 20, "name": "thread_name", "args": {"name": "python"}})
  ev = []
  for r in range(2):
    t0 = 1000 * r
    ev += [{"ph": "X", "pid": 1, "tid": 10, "ts": t0, "dur": 100, "name": "loop_fusion"},
           {"ph": "X", "pid": 1, "tid": 10, "ts": t0 + 300, "dur": 300, "name": "gemm_kernel"},
           {"ph": "X", "pid": 1, "tid": 10, "ts": t0 + 600, "dur": 100, "name": "loop_fusion"},
           {"ph": "X", "pid": 1, "tid": 11, "ts": t0 + 650, "dur": 50,
            "name": "MemcpyDtoH"},
           {"ph": "X", "pid": 1, "tid": 12, "ts": t0, "dur": 700, "name": "while.3"},
           {"ph": "X", "pid": 1, "tid": 13, "ts": t0, "dur": 700, "name": "jit_round"},
           {"ph": "X", "pid": 2, "tid": 20, "ts": t0, "dur": 1000, "name": "PjitFunction"}]
  return {"traceEvents": m + ev}


def test_device_figures_per_round():
  res = ts.summarize(_gpu_trace(), rounds=2, wall_s=0.002)
  (dev,) = res["devices"]
  assert dev["device"] == "/device:GPU:0"
  assert dev["streams"] == ["Stream #13(Compute)", "Stream #14(MemcpyD2H)"]
  assert dev["busy_ms_per_round"] == pytest.approx(0.5)  # the copy hides under a kernel
  assert dev["busy_fraction"] == pytest.approx(0.5)
  assert dev["kernels_per_round"] == 3
  assert dev["kernel_ms_per_round"] == pytest.approx(0.5)
  assert dev["median_kernel_us"] == 100
  assert dev["copies_per_round"] == 1 and dev["device_to_host_copies_per_round"] == 1
  assert res["wall_ms_per_round"] == pytest.approx(1.0) and res["fraction_of"] == "wall"
  lanes = {(x["process"], x["thread"]): x for x in res["lanes"]}
  compute = lanes[("/device:GPU:0", "Stream #13(Compute)")]
  assert compute["events_per_round"] == 3
  assert [(t["name"], t["ms_per_round"], t["count_per_round"]) for t in compute["top"]] == [
      ("gemm_kernel", 0.3, 1), ("loop_fusion", 0.2, 2)]
  assert lanes[("/host:CPU", "python")]["busy_ms_per_round"] == pytest.approx(1.0)
  ops = lanes[("/device:GPU:0", "XLA Ops")]
  assert [(t["name"], t["count_per_round"]) for t in ops["kinds"]] == [("while", 1)]


def test_kinds_drop_the_ops_number():
  assert [ts.kind(n) for n in ("fusion.12", "cond.2.clone", "loop_fusion", "copy.3.clone",
                               "$api.py:2277 device_get")] == [
      "fusion", "cond", "loop_fusion", "copy", "$api.py:2277 device_get"]


def test_device_without_stream_lanes_uses_its_other_lanes():
  tr = _gpu_trace()
  for e in tr["traceEvents"]:  # an export that names streams otherwise
    if e.get("name") == "thread_name" and e["args"]["name"].startswith("Stream"):
      e["args"]["name"] = e["args"]["name"].replace("Stream ", "GPU stream ")
  res = ts.summarize(tr, rounds=2)
  (dev,) = res["devices"]
  assert sorted(dev["streams"]) == ["GPU stream #13(Compute)", "GPU stream #14(MemcpyD2H)"]
  assert dev["kernels_per_round"] == 3
  # no wall time given: fractions of the traced window (0 to 2,000 us)
  assert res["fraction_of"] == "window" and res["window_ms_per_round"] == pytest.approx(1.0)
  assert dev["busy_fraction"] == pytest.approx(0.5)


def test_the_profilers_own_events_are_outside_the_window():
  tr = _gpu_trace()
  tr["traceEvents"].append({"ph": "X", "pid": 2, "tid": 20, "ts": 2000, "dur": 8000,
                            "name": "$profiler.py:271 stop_trace"})
  res = ts.summarize(tr, rounds=2)
  assert res["window_ms_per_round"] == pytest.approx(1.0)


def test_reads_a_cpu_trace_of_jax(tmp_path):
  f = jax.jit(lambda x: jax.lax.scan(lambda c, _: (jnp.tanh(c @ c), None), x, None,
                                     length=3)[0])
  x = jnp.ones((32, 32))
  f(x).block_until_ready()
  jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
  for _ in range(2):
    f(x).block_until_ready()
  jax.profiler.stop_trace()
  (path,) = glob.glob(f"{tmp_path}/plugins/profile/*/*.trace.json.gz")
  with gzip.open(path, "rt") as g:
    assert json.load(g)["traceEvents"]
  res = ts.summarize(ts.load(path), rounds=2, wall_s=0.01)
  assert res["devices"] == []  # XLA:CPU runs on host threads
  assert any(lane["process"] == "/host:CPU" and lane["events_per_round"] > 0
             for lane in res["lanes"])


def test_fill_archives_traces_within_its_budget(tmp_path, monkeypatch):
  """fill.py keeps each cell's trace in one tar (a lease returns a few files
  of bounded size) until the tar would pass its budget; the loose trace
  goes either way."""
  import tarfile
  monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
  fill = load_script("benchmarks/fill.py")
  tar = tmp_path / "fill-traces.tar"
  kept = []
  for i in range(3):
    trace = tmp_path / f".m-{i}-new.trace.json.gz"
    trace.write_bytes(bytes(300 * 1024))  # 300 KiB
    kept.append(fill.archive_trace(str(trace), str(tar), budget_mib=0.7))
    assert not trace.exists()
  assert kept == ["fill-traces.tar:m-0-new.trace.json.gz",
                  "fill-traces.tar:m-1-new.trace.json.gz", None]
  with tarfile.open(tar) as t:
    assert t.getnames() == ["m-0-new.trace.json.gz", "m-1-new.trace.json.gz"]
  assert tar.stat().st_size <= 0.7 * 2**20
