"""What each transport declares for the servers (so that no server tests a scheme)."""

from __future__ import annotations

from hpcsched.core.comm import hosts, registry


def test_tcp_needs_heartbeats_and_a_secret_and_listens_beside_the_scheduler():
    for scheme in ("tcp", "tls"):
        b = registry.backend_for(f"{scheme}://10.0.0.1:8786")
        assert b.needs_heartbeat and b.needs_secret and not b.same_process
        # the worker keeps the scheduler's scheme (a TLS cluster stays TLS) and listens
        # on the address it reaches the scheduler from (every interface if none)
        route = hosts.route_source("10.0.0.1") or "0.0.0.0"
        assert b.worker_listen_address(f"{scheme}://10.0.0.1:8786", None) == \
            f"{scheme}://{route}:0"
        assert b.worker_listen_address(f"{scheme}://127.0.0.1:8786", None) == \
            f"{scheme}://127.0.0.1:0"
        assert b.worker_listen_address(f"{scheme}://no-such-host.invalid:8786", None) == \
            f"{scheme}://0.0.0.0:0"
        assert b.worker_listen_address(f"{scheme}://10.0.0.1:8786", "node7") == \
            f"{scheme}://node7:0"
        assert b.worker_listen_address(f"{scheme}://[::1]:8786", "::1") == f"{scheme}://[::1]:0"


def test_inproc_peers_share_the_process():
    b = registry.backend_for("inproc://1/srv-0")
    assert b.same_process and not b.needs_heartbeat and not b.needs_secret
    assert b.worker_listen_address("inproc://1/srv-0", "node7") == "inproc://"


def test_mpi_ranks_are_known_to_the_job():
    # a rank that dies ends the job (no heartbeat needed); the job is the trust boundary
    b = registry.backend_for("mpi://0")
    assert not (b.needs_heartbeat or b.needs_secret or b.same_process)
    assert b.worker_listen_address("mpi://0", "node7") == "mpi://"


def test_where_a_dashboard_listens_and_who_has_a_rank():
    # beside the scheduler over TCP; loopback in-process; every interface of rank 0's
    # compute node under MPI, which users reach through an ssh tunnel
    tcp = registry.backend_for("tcp://10.0.0.1:8786")
    assert tcp.service_host("tcp://10.0.0.1:8786") == "10.0.0.1"
    assert tcp.service_host("tcp://[::1]:8786") == "::1"
    assert tcp.service_host("tcp://:8786") == "127.0.0.1"
    assert not tcp.reached_by_tunnel and tcp.rank_of("tcp://10.0.0.1:8786") is None
    inproc = registry.backend_for("inproc://1/srv-0")
    assert inproc.service_host("inproc://1/srv-0") == "127.0.0.1"
    assert inproc.rank_of("inproc://1/srv-0") is None
    mpi = registry.backend_for("mpi://0")
    assert mpi.service_host("mpi://0") == "0.0.0.0" and mpi.reached_by_tunnel
    assert mpi.rank_of("mpi://3") == 3 and mpi.rank_of("mpi://") is None
