"""The ops package's error tree: every error the operations and test tools raise on purpose.

Each class is defined next to the code that raises it and derives from
:class:`OpsError`, so the CLI (``runner.cli.errors``) turns any of them into one line
and exit code 2 with one ``except``::

    OpsError
    ├── PageError                        ops.page: alerts could not be delivered; they
    │                                    stay queued for the next attempt
    ├── FollowError                      ops.detect.follow: a path cannot be followed,
    │                                    or the state dir is damaged
    ├── KeyStoreError                    ops.detect.keystore: the follower's key table
    │                                    is damaged or disagrees with its checkpoint
    ├── RestoreError                     ops.restore: a snapshot that cannot (or must
    │                                    not) be put back
    ├── StackError                       ops.testing.stack: a child process of a local
    │                                    stack did not come up
    ├── AgentDemoError                   ops.demo.agents: `demo --agent` lacks the
    │                                    example or the framework's package
    ├── RealDemoError                    ops.demo.six_source: `demo --real` could not
    │                                    download or unpack its project
    ├── ChaosError                       ops.testing.chaos.campaign: the campaign could
    │                                    not run
    ├── ExpectError                      ops.testing.chaos.expect: a job's steps do not
    │                                    apply even without faults (a campaign bug)
    ├── HarnessError                     ops.testing.harness.loop: a sweep that cannot
    │                                    run, or an endpoint that cannot be measured
    └── RequestError                     ops.testing.fake_endpoint.plan: a request the
                                         fake endpoint answers 400

Private control-flow exceptions (``ops.testing.fault_proxy._Dropped``) never leave
their module and are not part of the tree. ``tests/ops/test_errors.py`` checks that
every public exception class of the package is drawn here and derives from the root.
The ``slotrunner.errors`` entry point names :class:`OpsError` to the CLI, which
catches it without importing ops.
"""

from __future__ import annotations


class OpsError(Exception):
    """Base of every error the ops package raises on purpose."""
