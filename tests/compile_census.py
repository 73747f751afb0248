"""Adds up the suite's compile log (conftest.py, ``JSFL_TEST_COMPILE_LOG``):
the tests that compile most, and how much the persistent cache served.

    JSFL_TEST_COMPILE_LOG=/tmp/census make test
    python tests/compile_census.py /tmp/census [--top 30]
"""

import argparse
import glob
import json


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("prefix")
  ap.add_argument("--top", type=int, default=30)
  args = ap.parse_args()
  tests: dict = {}
  for path in glob.glob(f"{args.prefix}.*.json"):
    with open(path) as f:
      for test, e in json.load(f).items():
        t = tests.setdefault(test, {k: 0 for k in e})
        for k, v in e.items():
          t[k] += v
  if not tests:
    raise SystemExit(f"no {args.prefix}.*.json: run the suite with JSFL_TEST_COMPILE_LOG set")
  total = sum(t["compile_s"] for t in tests.values())
  saved = sum(t["saved_s"] for t in tests.values())
  print(f"{len(tests)} tests: {total:.0f} s compiling in-process "
        f"({sum(t['compiles'] for t in tests.values())} programs), "
        f"{sum(t['cache_hits'] for t in tests.values())} served by the cache "
        f"(~{saved:.0f} s saved); subprocesses not counted")
  for test, t in sorted(tests.items(), key=lambda kv: -kv[1]["compile_s"])[:args.top]:
    print(f"{t['compile_s']:7.1f} s {t['compiles']:4d} compiled {t['cache_hits']:4d} hits  {test}")


if __name__ == "__main__":
  main()
