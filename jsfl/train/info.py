"""``jsfl info``: what this machine gives a run, and how a config would run.

Backend, devices and their memory, versions, the compilation cache, and for
a config the choices ``auto`` resolves to (client and seed execution, the
device mesh, conv lowering), without loading its data.
"""

from __future__ import annotations

import os
import sys

import jax

from jsfl import allocator
from jsfl import config as config_lib
from jsfl.core import sharding
from jsfl.models import layers
from jsfl.train import compile_cache
from jsfl.train.evaluate import eval_chunk
from jsfl.train.lifecycle import versions
from jsfl.train.programs import default_client_exec, default_client_pass, default_seed_exec


def _gib(n) -> str:
  return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _host_memory() -> int | None:
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def _device_line(d) -> str:
  stats = None
  try:
    stats = d.memory_stats()
  except Exception:  # noqa: BLE001 - not every backend reports memory
    stats = None
  limit = (stats or {}).get("bytes_limit")
  mem = _gib(limit) if limit else "memory not reported (host memory)"
  return f"  {d.id}: {d.platform} {getattr(d, 'device_kind', '?')}, {mem}"


def machine_lines() -> list[str]:
  v = versions()
  import jaxlib
  import orbax.checkpoint as ocp
  devs = jax.devices()
  host = _host_memory()
  lines = [
      f"jsfl {v['jsfl']} (source {v['jsfl_source']})  jax {v['jax']}  "
      f"jaxlib {jaxlib.__version__}  flax {v['flax']}  "
      f"optax {v['optax']}  orbax-checkpoint {getattr(ocp, '__version__', '?')}  "
      f"python {v['python']}",
      f"backend: {jax.default_backend()}  ({jax.device_count()} device"
      f"{'s' * (jax.device_count() > 1)}, {jax.process_count()} process"
      f"{'es' * (jax.process_count() > 1)})",
      *[_device_line(d) for d in devs],
      f"host: {os.cpu_count()} CPU cores" + (f", {_gib(host)} memory" if host else ""),
      f"compile cache: {_cache_text(compile_cache.cache_dir())}",
      f"GPU allocator: {allocator.describe()}",
  ]
  if jax.default_backend() == "cpu":
    lines.append("  no accelerator in use: for a GPU install jsfl[cuda12] or jsfl[cuda13] "
                 "(README, 'On a GPU')")
  return lines


def config_lines(cfg: dict) -> list[str]:
  """How ``cfg`` would run here: the exec choices ``auto`` resolves to."""
  x, me = cfg["exec"], cfg["method"]
  per_round = me["clients_per_round"] or config_lib.typed(cfg).partition.num_clients
  seeds = config_lib.typed(cfg).run.seeds
  client = default_client_exec(per_round) if x["client_exec"] == "auto" else x["client_exec"]
  seed = default_seed_exec() if x["seed_exec"] == "auto" else x["seed_exec"]
  try:
    mesh = sharding.mesh_shape(x["mesh"], jax.device_count(), seeds, per_round)
    mesh_text = f"seeds={mesh[0]}, clients={mesh[1]}"
  except ValueError as e:
    mesh_text = f"invalid here ({e})"
  conv = config_lib.typed(cfg).model.conv_impl
  dw = config_lib.typed(cfg).model.depthwise_impl
  grad = config_lib.typed(cfg).model.im2col_grad
  narrow = config_lib.typed(cfg).model.im2col_narrow
  return [
      f"config: {cfg['method']['name']} on {cfg['dataset']['name']}, "
      f"{cfg['model']['name']}, {cfg['partition']['num_clients']} clients "
      f"({per_round} per round), {seeds} seed{'s' * (seeds > 1)}, "
      f"{cfg['run']['rounds']} rounds",
      f"  exec.client_exec = {x['client_exec']} -> {client}",
      f"  exec.seed_exec = {x['seed_exec']} -> {seed}",
      f"  exec.mesh = {x['mesh']} -> {mesh_text}",
      f"  model.conv_impl = {conv} -> {layers.default_conv_impl() if conv == 'auto' else conv}",
      f"  model.eval_conv_impl = {cfg['model']['eval_conv_impl']}",
      f"  exec.eval_batch = {x['eval_batch']} -> {eval_chunk(x['eval_batch'])}",
      f"  model.depthwise_impl = {dw} -> "
      f"{layers.default_depthwise_impl() if dw == 'auto' else dw}",
      f"  model.im2col_grad = {grad} -> "
      f"{layers.default_im2col_grad() if grad == 'auto' else grad}",
      f"  model.im2col_narrow = {narrow} -> "
      f"{layers.default_im2col_narrow() if narrow == 'auto' else narrow}",
      f"  exec.client_pass = {x['client_pass']} -> "
      f"{default_client_pass() if x['client_pass'] == 'auto' else x['client_pass']}",
      f"  exec.precision = {x['precision']}",
      f"  exec.compile_cache = {x['compile_cache']} -> "
      f"{_cache_text(compile_cache.cache_dir(x['compile_cache']))}",
  ]


def _cache_text(path: str | None) -> str:
  """The cache directory as a run would use it: off, or why it cannot."""
  if path is None:
    return "off"
  why = compile_cache.unusable(path)
  return path if why is None else f"{path} (unusable: {why}; runs compile without it)"


def memory_lines(cfg: dict) -> list[str]:
  """The compiled round program's memory (XLA's memory analysis) at the
  config's seeds, and the most seeds whose program fits this device."""
  from jsfl.train import experiment, fit, memory, programs
  seeds = config_lib.typed(cfg).run.seeds
  one = {**cfg, "run": {**cfg["run"], "seeds": 1}}
  exp = experiment.prepare(one)
  init, rnd, _ = programs.build_programs(exp)
  slot, shared = programs.split_data(exp.data)
  widen = lambda t, k: jax.tree.map(lambda a: jax.numpy.concatenate([a] * k), t)
  needs: dict[int, int] = {}
  analyses = {}
  for k in sorted({1, 2, seeds}):
    keys = programs.make_seed_keys(range(k))
    compiled = fit.compile_round(rnd, init, keys, widen(slot, k), shared, k)
    need = fit.program_bytes(compiled)
    if need is None:
      return ["round program: this backend gives no memory analysis"]
    needs[k], analyses[k] = need, compiled.memory_analysis()
  limit = memory.device_memory()
  m = analyses[seeds]
  most = fit.slots_that_fit(needs[1], needs[2], limit)
  return [
      f"round program at {seeds} seed{'s' * (seeds > 1)} (XLA's memory analysis, compiled "
      f"here): {_gib(needs[seeds])} (arguments {_gib(m.argument_size_in_bytes)}, outputs "
      f"{_gib(m.output_size_in_bytes)}, temporaries {_gib(m.temp_size_in_bytes)})",
      f"  {_gib(max(needs[2] - needs[1], 0))} a seed: about {most} seeds fit in "
      f"{_gib(limit)} ({fit.USABLE:.0%} usable); a run of more calls its program on "
      "chunks of the seeds (exec.max_slots)",
  ]


def info(cfg: dict | None = None, compiled: bool = True) -> str:
  lines = machine_lines() + (config_lines(cfg) if cfg is not None else [])
  if cfg is not None and compiled:
    lines += memory_lines(cfg)
  return "\n".join(lines)


if __name__ == "__main__":
  sys.stdout.write(info() + "\n")
