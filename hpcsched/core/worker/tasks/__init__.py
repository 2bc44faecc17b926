"""What a running task is given and held to beyond a thread: its devices (GPUs)."""
