"""The runner package's error tree: every error the runner raises on purpose.

Each class is defined next to the code that raises it and derives from
:class:`RunnerError`, so a caller (the CLI) can catch the whole package with one
``except``. A class that existing callers catch as a built-in keeps that built-in
as a second base (marked ``+``)::

    RunnerError
    ├── SettingsError  + ValueError      runner.core.settings: an environment value
    │                                    slotrunner cannot use
    ├── JobIdError  + ValueError         runner.core.ids: a job id no door accepts
    ├── StampError                       runner.core.stamp: a slot stamp that exists
    │                                    but cannot be read
    ├── DurabilityError  + OSError       runner.core.durable: an fsync (or the write
    │                                    before it) failed; the record's fate is unknown
    ├── GitError                         runner.core.git: a git command that had to
    │                                    succeed failed
    ├── PollTimeout                      runner.core.poll: what was polled for did not
    │                                    happen in time
    ├── RedisUnavailable                 runner.redis_server: no Redis reached or started
    ├── PreflightError                   runner.worker.preflight: a Redis that would
    │                                    evict the keys that must survive
    ├── SlotError                        runner.slots.pool
    │   ├── NoSlotFree                   every slot stayed busy for the whole wait
    │   ├── ReleaseRefused               a release that is not the slot's current lease
    │   ├── UnknownSlot                  no slot of that id on this host
    │   ├── SlotBusy                     the slot's lock stayed held too long
    │   └── LeaseLostError               runner.slots.fence: the slot is no longer this
    │                                    attempt's lease; nothing more may touch it
    ├── WorkspaceError                   runner.workspace.git: a git, work tree or
    │                                    snapshot operation failed
    ├── AttemptFloorError                runner.worker.attempt_floor: the host's attempt
    │                                    floor cannot be read, locked or made durable
    ├── AdmissionError                   runner.admission.lease
    │   ├── AdmissionRefused             no capacity held: the request must not be sent
    │   ├── StaleCompletion              a completion whose lease is no longer live
    │   └── DeskMismatch                 the eval-run's desk has another bound
    ├── PlannerError                     runner.agent.planners: no usable completion
    │   └── PlannerStopped               the job was told to stop mid-request
    ├── WorkspaceCallError               runner.agent.api: a python agent's call refused,
    │   │                                stale or not made (``reason`` says why)
    │   └── WorkspaceOutcomeUnknown      sent, and its outcome is unknown
    ├── CommandError  + ValueError       runner.agent.command: a command planner's program
    │                                    that cannot be found or started
    ├── MiniSweAgentError                runner.agent.adapters.mini_swe_agent: a config
    │                                    that cannot run in a slot, or an agent that
    │                                    ended without submitting
    ├── GatewayConfigError               runner.gateway.app: the gateway would listen
    │                                    off loopback without a token
    ├── GatewayStartError                runner.gateway.server: its server did not come up
    ├── EnvError                         runner.envs.store: an environment that cannot
    │   │                                be keyed, built, used or removed
    │   ├── EnvBusy                      being built or used by a running job
    │   └── EnvSetupFailed               runner.envs.build: a setup command failed
    ├── SpecError  + ValueError          runner.jobs.submit: a job spec that cannot run
    ├── EntryError  + ValueError         runner.jobs.entry: a python planner's entry that
    │                                    cannot be imported or called
    ├── ResultCopyError                  runner.jobs.result_copy: a kept result that
    │                                    cannot be read or parsed
    └── CliError                         runner.cli.errors: a problem the command line
                                         names itself (an unknown job, a bad spec file)

Private control-flow exceptions (``runner.worker.attempt._Stopped``) never leave their
module and are not part of the tree. ``tests/runner/test_errors.py`` checks that every
public exception class of the package is drawn here and derives from the root.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error the runner package raises on purpose."""
