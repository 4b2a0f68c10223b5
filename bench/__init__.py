"""slotrunner's benchmark suite: speed is measured, not asserted.

Run everything with ``python -m bench.run`` (``--quick`` for a smoke run, ``--only``
to pick benchmarks, ``--json-out`` for machine-readable figures). Each benchmark is
one module; every figure is a ratio to a baseline measured in the same run on the
same machine. The goals (also in ``bench/README.md`` and judged in ``RESULTS.md``):

========== ===================================================================
pipeline   one write_file through the full pipeline <= 1.5x a bare POST + fsync
recycle    slot recycle <= 1.5x bare git checkout + clean + reset
receipts   one writer >= 0.9x raw append+fsync; 8 slots >= 3x one writer
detector   >= 10x the jq|awk alert's pipeline; peak RSS < 100 MB on a large log
e2e        isolation overhead <= 15 % of job time; orchestration reported
sandbox    bwrap start-up per run_tests vs a bare spawn (reported)
memory     peak RSS of tool server, worker, detector (reported)
========== ===================================================================
"""
