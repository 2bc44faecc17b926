"""The pure state machines: the scheduler's state and its components, the worker's state,
their events, and the policies they decide with. No I/O, no threads, no clock."""
