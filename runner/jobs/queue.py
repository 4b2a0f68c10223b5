"""The Celery names a job travels by: what a client sends and a worker consumes.

``runner.jobs.submit`` sends ``TASK_NAME`` to ``QUEUE``; ``runner.worker.tasks``
registers the task under that name and ``runner.worker.celery_app`` makes the queue
the workers' default. Both sides import them from here, so neither imports the other.
"""

from __future__ import annotations

QUEUE = "slotrunner"
TASK_NAME = "slotrunner.run_agent_job"
