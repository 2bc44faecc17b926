"""What rank 0 and the worker ranks have imported once the first task is done."""

import json
import sys

from hpcsched import Client
from tests.heavy_imports import heavy_loaded

#: what a worker rank does not need: the client's and the coordination primitives' protocol
CLIENT_SIDE = ("hpcsched.core.protocol.client", "hpcsched.core.protocol.primitives",
               "hpcsched.core.protocol.messages", "hpcsched.core.client.client")


#: what a worker rank runs no command with, at its start or for a task that runs none: it
#: imports ``subprocess`` (a few ms of each rank's start) where it runs one
COMMANDS = ("subprocess",)


def client_side_loaded():
    return [m for m in CLIENT_SIDE if m in sys.modules]


def commands_loaded():
    return [m for m in COMMANDS if m in sys.modules]


with Client() as client:
    assert client.submit(abs, -1).result() == 1
    rank0 = heavy_loaded()
    workers = sorted(client.run(heavy_loaded).values())
    client_side = sorted(client.run(client_side_loaded).values())
    commands = sorted(client.run(commands_loaded).values())
print("IMPORTS " + json.dumps({"rank0": rank0, "workers": workers, "client_side": client_side,
                               "commands": commands}), flush=True)
