"""A synthetic slotrunner event log with known incidents: the detector's test input.

:class:`LogSynth` writes plausible multi-host traffic (leases, releases, reads,
applies, replays, refusals, failures), none of which is an incident; ``incidents``
injects one incident of a named variant, or one garbage line, and remembers exactly
where (``expected``, ``malformed``). The tests of ``ops.detect`` compare the
detector's findings with those sets, and ``bench/detector.py`` makes the large logs it
measures with :func:`synth_log`. It ships here, with the other test and measurement
tools, so that neither the tests nor the benchmarks import each other.
"""

from ops.testing.synthlog.build import clean_log, synth_log
from ops.testing.synthlog.incidents import GARBAGE, INJECTIONS, inject, write_garbage
from ops.testing.synthlog.traffic import MUTATING, READ_ONLY, LogSynth

__all__ = [
    "GARBAGE",
    "INJECTIONS",
    "MUTATING",
    "READ_ONLY",
    "LogSynth",
    "clean_log",
    "inject",
    "synth_log",
    "write_garbage",
]
