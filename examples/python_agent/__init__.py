"""An agent for slotrunner's ``python`` planner (see README.md here)."""
