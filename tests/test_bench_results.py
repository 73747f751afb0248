"""``benchmarks/_results.py``: the one spelling of a benchmark's result file
names (the committed results and the docs cite files by these names)."""

import ast
import json
import pathlib
import re

from conftest import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
results = load_script("benchmarks/_results.py")


def test_path_spells_script_tags_and_time(tmp_path, monkeypatch):
  monkeypatch.setattr(results.socket, "gethostname", lambda: "vm.example.org")
  out = tmp_path / "new"
  when = "20261124-011624"
  p = results.path(str(out), "vs_torch", "cpu", results.host(), when=when)
  assert p == str(out / "vs_torch-cpu-vm.example.org-20261124-011624.json")
  assert out.is_dir()  # made for the caller
  # empty tags are left out (census without --label), ext="" is the stem
  assert results.path(str(out), "census", "cpu", "vm", "", when=when) == str(
      out / "census-cpu-vm-20261124-011624.json")
  assert results.path(str(out), "sweep", "cpu", results.host(short=True), ext="",
                      when=when) == str(out / "sweep-cpu-vm-20261124-011624")
  assert re.fullmatch(r"step_breakdown-vm\.example\.org-2t-\d{8}-\d{6}\.json",
                      pathlib.Path(results.path(str(out), "step_breakdown", results.host(),
                                                "2t")).name)
  assert results.DIR == str(ROOT / "benchmarks" / "results")


def test_the_committed_names_are_the_helpers(tmp_path):
  """The names of committed results, taken apart into their tags and put
  back together by the helper, are the same names."""
  for name, script, tags in [
      ("vs_torch-cpu-vm-20261124-011624.json", "vs_torch", ("cpu", "vm")),
      ("throughput-cpu-mobilenet_v1-20261124-041737.json", "throughput",
       ("cpu", "mobilenet_v1")),
      ("hydra_vs_authors-multisfl-vm-20261126-200216.json", "hydra_vs_authors",
       ("multisfl", "vm")),
      ("step_breakdown-vm-2t-20261125-124809.json", "step_breakdown", ("vm", "2t")),
      ("gpu-h200-20261127/fill-gpu-vm-20261127-083207.json", "fill", ("gpu", "vm")),
      ("census-20261127/census-cpu-vm-after-resnet18-sfl-xla-20261127-091747.json", "census",
       ("cpu", "vm", "after-resnet18-sfl-xla"))]:
    committed = ROOT / "benchmarks/results" / name
    assert committed.is_file(), committed
    when = "-".join(committed.stem.split("-")[-2:])
    assert pathlib.Path(results.path(str(tmp_path), script, *tags, when=when)).name == (
        committed.name)


def test_writes_whole_files_and_partials(tmp_path):
  out = str(tmp_path)
  p = results.write_json(results.path(out, "fill", "cpu", "vm", when="20260101-000000"),
                         {"rows": [1]})
  assert json.loads(pathlib.Path(p).read_text()) == {"rows": [1]}
  assert not list(tmp_path.glob("*.tmp"))
  partial = results.write_partial(out, "fill", {"rows": [1, 2]})
  assert pathlib.Path(partial).name == "fill-partial.json"
  assert json.loads(pathlib.Path(partial).read_text()) == {"rows": [1, 2], "partial": True}
  results.drop_partial(out, "fill")
  results.drop_partial(out, "fill")  # gone already: nothing to do
  assert sorted(q.name for q in tmp_path.iterdir()) == ["fill-cpu-vm-20260101-000000.json"]


def test_no_benchmark_spells_a_result_name_itself():
  """Every script names its files through the helper: none formats a time
  stamp or joins a ``results`` folder of its own."""
  for script in sorted((ROOT / "benchmarks").glob("*.py")):
    if script.name == "_results.py":
      continue
    text = script.read_text()
    tree = ast.parse(text)
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if "%Y%m%d" in s], script.name
    assert not re.search(r"[\"'](benchmarks/)?results[\"']\)", text), script.name
    assert not [s for s in strings if s.endswith("-partial.json") and " " not in s], script.name
    assert "gethostname" not in text, script.name


MACHINE_KEYS = {"host", "cpu", "cpus", "cpus_usable", "backend", "device", "jax"}


def test_the_machine_record_names_cpu_device_and_jax():
  rec = results.machine(extra="x")
  assert MACHINE_KEYS <= set(rec) and rec["extra"] == "x"
  assert rec["backend"] == "cpu" and rec["cpu"] and 1 <= rec["cpus_usable"] <= rec["cpus"]


def test_results_from_the_shared_record_on_name_their_machine():
  """Every result written since every script took its ``machine`` record
  from ``_results.machine`` (2026-11-29) names the CPU, the device and jax:
  a figure is read against the machine it was measured on."""
  checked = 0
  for p in sorted((ROOT / "benchmarks/results").rglob("*.json")):
    stamp = re.search(r"-(\d{8})-\d{6}\.json$", p.name)
    if not stamp or stamp.group(1) < "20261129":
      continue
    rec = json.loads(p.read_text()).get("machine") or {}
    missing = MACHINE_KEYS - set(rec)
    assert not missing, f"{p.relative_to(ROOT)}: machine lacks {sorted(missing)}"
    checked += 1
  assert checked  # teacher_exec-cpu-vm-20261129-094216.json at least
  # the scripts' sources: none builds a record of its own any more
  for script in (ROOT / "benchmarks").glob("*.py"):
    tree = ast.parse(script.read_text())
    own = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
           and n.name == "machine" and script.name != "_results.py"]
    assert not own or "_results.machine(" in script.read_text(), script.name
