"""A job id: the one rule every door applies (docs/architecture.md, "Job spec").

A job id names a Redis key, a file under ``attempts/``, a git ref
``refs/slotrunner/snapshots/<job_id>/start`` and a field of every tool-call envelope,
so one rule serves all of them: 1 to ``JOB_ID_MAX_CHARS`` letters, digits, ``.``,
``_`` or ``-``, starting with a letter or digit, with no ``..`` and no ``.lock`` at the
end (the two names git refuses in a ref that the characters alone allow). The whole
string must match -- ``fullmatch``, never ``match`` with ``$``, which also accepts a
trailing newline.

The job spec, the envelope and other pydantic models use :data:`JobId`; the CLI,
snapshot refs and the attempt floor call :func:`check_job_id` or :func:`valid_job_id`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from runner.errors import RunnerError

JOB_ID_MAX_CHARS = 128
JOB_ID_RE = re.compile(
    rf"(?!.*\.\.)(?!.*\.lock\Z)[A-Za-z0-9][A-Za-z0-9._-]{{0,{JOB_ID_MAX_CHARS - 1}}}"
)
JOB_ID_RULE = (
    f"1-{JOB_ID_MAX_CHARS} letters, digits, '.', '_' or '-', starting with a letter or "
    "digit, without '..' and not ending in '.lock'"
)


class JobIdError(RunnerError, ValueError):
    """A job id no door accepts (a ValueError, so pydantic reports it as invalid input)."""


def valid_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID_RE.fullmatch(value) is not None


def check_job_id(value: object) -> str:
    """``value`` when it is a job id; otherwise :class:`JobIdError` saying why not."""
    if not valid_job_id(value):
        raise JobIdError(f"job id {value!r} is not valid: expected {JOB_ID_RULE}")
    assert isinstance(value, str)
    return value


JobId = Annotated[str, AfterValidator(check_job_id)]
