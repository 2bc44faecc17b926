"""The worker server: peers, memory, spill, the task pool, execution, the nanny."""
