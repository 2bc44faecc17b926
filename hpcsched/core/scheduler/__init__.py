"""The scheduler server: runs the scheduler state over any transport, answers requests."""
