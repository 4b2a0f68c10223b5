"""Helpers shared by the tests (and only by them): no test imports another test module.

``toolserver`` starts a real tool server for one test's home, ``stack`` adds real
Celery workers and gated jobs, ``repos`` makes real git repositories, ``detectlog``
writes and judges single log lines for the detector's tests, ``clock`` is the
injected clock of the admission desk's tests. The synthetic whole-log generator is
shipped (``ops.testing.synthlog``) because ``bench/`` uses it too.
"""
