"""An MCP client run as slotrunner's ``command`` planner (see README.md here)."""
