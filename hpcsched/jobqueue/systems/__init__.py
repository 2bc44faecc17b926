"""The batch systems, one module each: its commands, formats and in-job environment.

Each module holds a :class:`~hpcsched.jobqueue.base.BatchSystem` subclass (what the
system is, as data and small hooks) and its ``JobQueueCluster`` subclass.
"""
