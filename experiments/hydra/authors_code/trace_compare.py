"""How far apart two step traces are, step by step.

For each traced server step ``k`` (the server's tensors, ``k<k>:``) and
each traced round ``r`` (the whole model's, ``r<r>:``), and each pair of
traces, the difference of every tensor divided by the size of its change
from the initialisation in the first trace (``|a_k - b_k| / |a_k - init|``,
Frobenius norms): 1e-12 is the same computation up to rounding, 1 an
unrelated one.  A tensor that hardly moves (a BatchNorm scale after a few
small steps) makes that ratio large for a tiny difference, so each point
also gives the difference relative to the tensor itself (``of_value``,
``|a_k - b_k| / |a_k|``).  Points one of the two traces lacks are left out.
Prints the median and the largest over the tensors and writes them to JSON::

    python experiments/hydra/authors_code/trace_compare.py OUT.json \
        jsfl64=/tmp/trace/jsfl64.npz authors64=/tmp/trace/authors64.npz ...

Every named trace is compared with the first (the reference).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def distances(ref, other, init, prefix: str) -> tuple[list[float], list[float]]:
  """Per tensor under ``prefix``: the difference over the change from the
  initialisation, and over the tensor's own size."""
  out, of_value = [], []
  for name in ref.files:
    if not name.startswith(prefix) or name not in other.files:
      continue
    path = name.split(":", 1)[1]
    moved = np.linalg.norm(ref[name] - init[f"init:{path}"])
    if moved > 0:
      diff = np.linalg.norm(ref[name] - other[name])
      out.append(float(diff / moved))
      of_value.append(float(diff / np.linalg.norm(ref[name])))
  return out, of_value


def machine() -> dict:
  import platform
  out = {"platform": platform.platform(), "cpus": os.cpu_count(),
         "python": platform.python_version()}
  try:
    import jax
    out["jax"] = jax.__version__
  except ImportError:
    pass
  return out


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) < 3 or any("=" not in a for a in argv[1:]):
    sys.exit("usage: trace_compare.py OUT.json REF_NAME=REF.npz NAME=TRACE.npz ...")
  out_file, named = argv[0], [a.split("=", 1) for a in argv[1:]]
  traces = {n: np.load(p) for n, p in named}
  ref_name, ref = named[0][0], traces[named[0][0]]
  inits = [t for t in traces.values() if "steps" in t.files]  # trace_jsfl.py's files
  if not inits:
    sys.exit("trace_compare: no trace_jsfl.py file (with the initialisation) among them")
  init = inits[0]
  steps = [int(k) for k in init["steps"]]
  rounds = int(init["rounds"]) if "rounds" in init.files else 0
  points = [(f"step {k}", f"k{k}:") for k in steps] + [
      (f"round {r + 1}", f"r{r}:") for r in range(rounds)]
  result = {"reference": ref_name, "steps": steps, "rounds": rounds, "pairs": {},
            "machine": machine()}
  for name, trace in list(traces.items())[1:]:
    rows = {}
    for label, prefix in points:
      d, v = distances(ref, trace, init, prefix)
      if not d:
        continue
      rows[label] = {"median": float(np.median(d)), "max": float(np.max(d)),
                     "of_value_median": float(np.median(v)),
                     "of_value_max": float(np.max(v)), "tensors": len(d)}
      print(f"{name:>12s} vs {ref_name}: {label:9s}  median {rows[label]['median']:.2e}"
            f"  max {rows[label]['max']:.2e}  of the value: max "
            f"{rows[label]['of_value_max']:.2e}")
    result["pairs"][name] = rows
  os.makedirs(os.path.dirname(os.path.abspath(out_file)), exist_ok=True)
  with open(out_file, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")


if __name__ == "__main__":
  main()
