"""A census of a config's compiled round program, device-independent.

Lowers (and compiles, for XLA's memory analysis) the round program that
``jsfl run CONFIG`` would build, at each ``--seeds`` count, and reports:

* every convolution of the lowered StableHLO by (feature_group_count,
  batch_group_count, window, stride, lhs dilation): the lowering decides
  which kernels a backend can call (on a GPU a feature-grouped convolution
  can be neither a cuDNN backward-filter nor a backward-input call);
* ``dot_general``s with and without batch dimensions (batched matmuls);
* ``while`` loops;
* XLA's memory analysis of the compiled program on this backend (argument,
  output, temp bytes), per slot and per sample of a segment (slots x
  participants x batch: the samples trained side by side).

``--as gpu`` resolves the ``auto`` choices (client and seed execution, conv
lowerings) as they resolve on a GPU, so the lowered program is the one a GPU
would compile, whichever backend this runs on.

Usage::

  python benchmarks/census.py dataset.name=synthetic model.name=mobilenet_v1 \\
      --seeds 1 4 16 --as gpu
  python benchmarks/census.py experiments/core/demo.toml --seeds 1 2

Writes ``benchmarks/results/census-<backend>-<host>-[<label>-]<time>.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

import jax

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # a test loads it by path
  sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (benchmarks/ is not a package: a sibling module)

from jsfl import config as config_lib
from jsfl.methods import sfedkd
from jsfl.models import layers
from jsfl.train import experiment, programs

_CONV = re.compile(r"stablehlo\.convolution.*?\[([^\]]*)\]x\[([^\]]*)\]->\[[^\]]*\]"
                   r"(?:, window = \{([^}]*)\})?.*?batch_group_count = (\d+).*?"
                   r"feature_group_count = (\d+).*?: \(tensor<([^>]*)>, tensor<([^>]*)>\)")
_DOT = re.compile(r"stablehlo\.dot_general.*?(batching_dims = \[[^\]]*\])?"
                  r".*?contracting_dims")


def _dims(tensor_type: str) -> list[int]:
  return [int(d) for d in tensor_type.split("x")[:-1]]


def census_text(text: str) -> dict:
  """The convolutions, dot_generals and loops of lowered StableHLO text.

  Returns:
    ``{"convolutions": {key: count}, "convolutions_total": int,
    "feature_grouped": int, "batch_grouped": int, "dot_general": {"batched":
    int, "plain": int}, "while": int}``; a convolution's key reads
    ``fgc=F bgc=B window=HxW stride=S lhs_dilate=D``.
  """
  convs: collections.Counter = collections.Counter()
  fgc_n = bgc_n = 0
  for line in text.splitlines():
    if "stablehlo.convolution" not in line:
      continue
    m = _CONV.search(line)
    if m is None:
      raise ValueError(f"unparsed convolution: {line.strip()[:200]}")
    _, rhs_spec, window, bgc, fgc, _, rhs_type = m.groups()
    spec = [s.strip() for s in rhs_spec.split(",")]
    rhs = _dims(rhs_type)
    size = "x".join(str(rhs[spec.index(d)]) for d in ("0", "1") if d in spec)
    stride = re.search(r"stride = \[([^\]]*)\]", window or "")
    dil = re.search(r"lhs_dilate = \[([^\]]*)\]", window or "")
    key = (f"fgc={fgc} bgc={bgc} window={size} "
           f"stride={(stride.group(1) if stride else '1, 1').replace(', ', 'x')}"
           + (f" lhs_dilate={dil.group(1).replace(', ', 'x')}" if dil else ""))
    convs[key] += 1
    fgc_n += int(fgc) > 1
    bgc_n += int(bgc) > 1
  dots = {"batched": 0, "plain": 0}
  for line in text.splitlines():
    if "stablehlo.dot_general" in line:
      dots["batched" if "batching_dims" in line else "plain"] += 1
  return {"convolutions": dict(sorted(convs.items())),
          "convolutions_total": sum(convs.values()),
          "feature_grouped": fgc_n, "batch_grouped": bgc_n,
          "dot_general": dots, "while": text.count("stablehlo.while")}


def as_backend(cfg: dict, backend: str) -> dict:
  """``cfg`` with its ``auto`` execution and lowering choices resolved as on
  ``backend`` (the data and everything else unchanged)."""
  cfg = json.loads(json.dumps(cfg))
  x, m = cfg["exec"], cfg["model"]
  n = cfg["method"]["clients_per_round"] or cfg["partition"]["num_clients"]
  if x["client_exec"] == "auto":
    x["client_exec"] = programs.default_client_exec(n, backend)
  if x["seed_exec"] == "auto":
    x["seed_exec"] = programs.default_seed_exec(backend)
  if m["conv_impl"] == "auto":
    m["conv_impl"] = layers.default_conv_impl(backend)
  if m["depthwise_impl"] == "auto":
    m["depthwise_impl"] = layers.default_depthwise_impl(backend)
  if m.get("im2col_grad", "auto") == "auto":
    m["im2col_grad"] = layers.default_im2col_grad(backend)
  if m.get("im2col_narrow", "auto") == "auto":
    m["im2col_narrow"] = layers.default_im2col_narrow(backend)
  if cfg["method"].get("teacher_exec") == "auto":  # SFedKD's teachers' loop
    cfg["method"]["teacher_exec"] = sfedkd.default_teacher_exec(backend)
  return cfg


def round_census(cfg: dict, compile_: bool = True) -> dict:
  """Lowers (and compiles) ``cfg``'s round program; its census and memory."""
  exp = experiment.prepare(cfg)
  init, rnd, _ = programs.build_programs(exp)
  slot, shared = programs.split_data(exp.data)
  seed_keys = programs.make_seed_keys(exp.seeds)
  state = jax.eval_shape(init, seed_keys)
  lowered = rnd.lower(state, slot, programs.round_keys(seed_keys, 0), shared)
  out = census_text(lowered.as_text())
  slots = len(exp.seeds)
  samples = slots * exp.setup.clients_per_round * exp.setup.batch_size
  out.update(slots=slots, samples_per_segment=samples)
  if compile_:
    t = time.perf_counter()
    compiled = lowered.compile()
    out["compile_s"] = round(time.perf_counter() - t, 2)
    mem = compiled.memory_analysis()
    if mem is not None:
      for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"):
        out[k] = int(getattr(mem, k, 0))
      out["temp_bytes_per_slot"] = out["temp_size_in_bytes"] // slots
      out["temp_bytes_per_sample"] = out["temp_size_in_bytes"] // samples
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("config", nargs="*", help="a TOML file and/or key=value overrides")
  ap.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 16])
  ap.add_argument("--as", dest="as_backend", default=None, choices=("cpu", "gpu", "tpu"),
                  help="resolve the auto choices as on this backend")
  ap.add_argument("--no-compile", action="store_true",
                  help="lower only (no memory analysis)")
  ap.add_argument("--label", default="", help="a name for this census in the JSON")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args(argv)
  files = [a for a in args.config if "=" not in a]
  overrides = [a for a in args.config if "=" in a]
  if len(files) > 1:
    ap.error(f"one config file; got {files}")
  rows = []
  for seeds in args.seeds:
    cfg = config_lib.load_config(files[0] if files else None,
                                 overrides + [f"run.seeds={seeds}"])
    if args.as_backend:
      cfg = as_backend(cfg, args.as_backend)
    row = {"seeds": seeds, **round_census(cfg, not args.no_compile)}
    rows.append(row)
    mem = (f"temp {row['temp_size_in_bytes'] / 2**20:8.1f} MiB, "
           f"{row['temp_bytes_per_sample'] / 2**20:6.3f} MiB a sample"
           if "temp_size_in_bytes" in row else "")
    print(f"seeds={seeds:3d}: {row['convolutions_total']} convolutions "
          f"({row['feature_grouped']} feature-grouped, {row['batch_grouped']} batch-grouped), "
          f"dot_general {row['dot_general']}, {row['while']} while; {mem}", flush=True)
  res = {"machine": _results.machine(), "label": args.label, "config": args.config,
         "as_backend": args.as_backend, "rows": rows,
         "command": "python benchmarks/census.py " + " ".join(sys.argv[1:] if argv is None
                                                            else argv)}
  path = _results.write_json(_results.path(args.out, "census", jax.default_backend(),
                                             _results.host(), args.label), res)
  print(f"wrote {path}")
  return res


if __name__ == "__main__":
  main()
