"""What a running task is given and held to beyond a thread: its devices (GPUs), its
time limit, what it prints (kept with it, forwarded when asked)."""
