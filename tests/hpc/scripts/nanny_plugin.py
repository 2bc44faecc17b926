"""``mpiexec -n 3 python -m hpcsched nanny_plugin.py``: MPI ranks have no nanny (mpiexec
started them; a rank cannot be restarted), so a nanny plugin is refused with that reason,
and the cluster goes on working."""

from hpcsched import Client, NannyPlugin


class Env(NannyPlugin):
    restart = True

    def setup(self, nanny):
        nanny.env["X"] = "1"


with Client() as client:
    try:
        client.register_plugin(Env(), name="env")
    except RuntimeError as e:
        print(f"refused: {e}", flush=True)
    else:
        raise SystemExit("a nanny plugin was accepted by MPI ranks")
    assert client.submit(sum, [1, 2]).result(timeout=30) == 3
print("nanny plugin under mpi ok", flush=True)
