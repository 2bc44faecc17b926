"""Command tasks: programs run on the workers as tasks, their output kept in files.

``Client.submit_command`` and ``Client.map_command`` (:mod:`.run`) give a future per
command whose result is a :class:`~hpcsched.commands.run.CommandResult`; a command that
exits non-zero fails its future with :class:`~hpcsched.commands.run.CommandFailed`,
naming the command, its status and the tail of its stderr. ``hpcsched submit`` and
``hpcsched job ...`` (:mod:`.jobs`, :mod:`.cli`) do the same from a shell, as jobs of
tasks kept by the scheduler.
"""
