"""The progress line: the time left at the process's own pace."""

import pytest

from jsfl.rundir import duration_text
from jsfl.train.lifecycle import Progress


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (44.6, "45s"), (60, "1m00s"),
                                          (725, "12m05s"), (3600, "1h00m"),
                                          (11220, "3h07m"), (187200, "2d04h")])
def test_duration_text(seconds, text):
  assert duration_text(seconds) == text


def test_time_left_leaves_out_the_first_round_and_counts_evaluations(capsys):
  """The first round a process runs compiles, so the pace starts after it;
  a resumed run times only its own rounds."""
  now = [0.0]
  bar = Progress(1000, True, clock=lambda: now[0])
  bar.tty = False
  # resumed at round 100: the first round here took 300 s (compilation)
  now[0] = 300.0
  bar.update(101, 50.0, 1.0)
  assert "left" not in capsys.readouterr().err
  # four rounds of 90 s each, the evaluated one included: 90 s a round
  for r in range(102, 106):
    now[0] += 90.0
    bar.update(r, 51.0 if r == 105 else None, 1.0)
  line = capsys.readouterr().err.strip()
  assert line.startswith("round  105/1000") and line.endswith("| 22h22m left")  # 895 x 90 s
  now[0] += 90.0
  bar.update(1000, 60.0, 1.0, final=True)
  assert "left" not in capsys.readouterr().err


def test_a_terminal_line_is_padded_over_a_longer_one(capsys):
  now = [0.0]
  bar = Progress(10, True, clock=lambda: now[0])
  bar.tty = True
  for r, t in ((1, 100.0), (2, 200.0), (10, 1000.0)):
    now[0] = t
    bar.update(r, None, 1.0, final=r == 10)
  lines = capsys.readouterr().err.split("\r")[1:]
  assert lines[1].endswith("| 13m20s left")
  assert lines[2].endswith("samples/s" + " " * len(" | 13m20s left") + "\n")
  assert len(lines[2]) == len(lines[1]) + 1
