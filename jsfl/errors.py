"""The errors a user can cause, as opposed to bugs.

Every :class:`UserError` is reported by the ``jsfl`` command as one line on
stderr (``jsfl: error: MESSAGE``) with exit status 2; its message names the
offending value or file and what would be accepted.  Anything else that
escapes a subcommand is a bug: the command prints its traceback and says so.

Importable without JAX (the config layer and the docs use it).
"""

from __future__ import annotations


class UserError(Exception):
  """A bad input or a fault of the environment, reported in one line."""


class DataError(UserError, ValueError):
  """A dataset that is missing, unreadable or unusable with the config."""


class RunDirError(UserError):
  """A run directory that cannot be created, is taken, or is locked."""


class CheckpointError(UserError, ValueError):
  """No checkpoint of a run restores, or none matches the run's config."""


class OutputError(UserError):
  """An output path (``--out``) that cannot be written."""


class Diverged(UserError):
  """Training produced a non-finite loss or non-finite parameters.

  Attributes:
    diverged: ``{seed: round}`` of every seed that diverged.
    run_dir: the run directory (kept: it holds the rounds before).
  """

  def __init__(self, message: str, diverged: dict[int, int], run_dir: str):
    super().__init__(message)
    self.diverged, self.run_dir = dict(diverged), run_dir


def os_error_line(err: OSError, what: str = "") -> str:
  """One line for an :class:`OSError` on a path: the path, then the reason."""
  path = err.filename if err.filename is not None else ""
  reason = err.strerror or str(err)
  subject = f"{what} {path!r}" if what and path else (what or repr(path))
  return f"{subject}: {reason}".strip()
