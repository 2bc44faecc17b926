"""Which address a server names: routes towards a peer, the default route, interfaces.

The routing table is the real one where it can be (a route to 127.0.0.1 always exists);
the cases a test machine lacks (a login node with a cluster network, a compute node
without a default route) are drawn with a fake probe and fake interfaces.
"""

from __future__ import annotations

import pytest

from hpcsched.core.comm import hosts
from hpcsched.launchers.address import NoRoutableAddress, choose_scheduler_host

LOGIN = {"lo": ["127.0.0.1"], "eth0": ["192.0.2.2"], "hsbr0": ["10.77.0.1"]}


def login_routes(target: str) -> str | None:
    """A login node: the default route leaves by eth0, the cluster network is hsbr0."""
    if target.startswith("10.77.0."):
        return "10.77.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    return "192.0.2.2"


@pytest.mark.timeout(10)
def test_the_route_to_loopback_and_to_a_name_that_does_not_resolve():
    assert hosts.route_source("127.0.0.1") == "127.0.0.1"
    assert hosts.route_source("no-such-host.invalid") is None


@pytest.mark.timeout(10)
def test_routable_address_prefers_the_route_towards_the_peer():
    assert hosts.routable_address(["10.77.0.11"], probe=login_routes,
                                  interfaces=LOGIN) == "10.77.0.1"
    assert hosts.routable_address(probe=login_routes, interfaces=LOGIN) == "192.0.2.2"
    # a compute node without a default route: its interface's address
    assert hosts.routable_address(probe=lambda t: None,
                                  interfaces={"lo": ["127.0.0.1"], "eth0": ["10.77.0.11"]}
                                  ) == "10.77.0.11"
    assert hosts.routable_address(probe=lambda t: None, interfaces={"lo": ["127.0.0.1"]}) is None
    assert hosts.describe_interfaces(LOGIN) == "eth0 192.0.2.2, hsbr0 10.77.0.1, lo 127.0.0.1"
    assert hosts.routable_addresses(LOGIN) == ["192.0.2.2", "10.77.0.1"]


@pytest.mark.timeout(10)
def test_contact_host_names_a_bound_host_as_it_is_and_a_wildcard_by_its_route():
    assert hosts.contact_host("10.1.2.3") == "10.1.2.3"
    wildcard = hosts.contact_host("0.0.0.0")
    assert wildcard == (hosts.routable_address() or wildcard)
    assert wildcard != "0.0.0.0"


@pytest.mark.timeout(10)
def test_a_batch_cluster_chooses_the_network_of_its_compute_nodes_and_says_how():
    c = choose_scheduler_host(toward=["127.0.0.1", "10.77.0.11"], probe=login_routes)
    assert (c.host, c.how) == ("10.77.0.1", "the source address of the route to the compute "
                                            "node 10.77.0.11")
    # nodes on this very host (NodeAddr=127.0.0.1): the default route's address
    c = choose_scheduler_host(toward=["127.0.0.1"], probe=login_routes)
    assert (c.host, c.how) == ("192.0.2.2", "the source address of this host's default route")
    assert choose_scheduler_host(host="login1", toward=["10.77.0.11"]).host == "login1"
    assert choose_scheduler_host(interface="lo").host == "127.0.0.1"


@pytest.mark.timeout(10)
def test_only_loopback_is_an_error_naming_the_ways_to_choose(monkeypatch):
    monkeypatch.setattr(hosts, "up_interfaces", lambda: {"lo": ["127.0.0.1"]})
    with pytest.raises(NoRoutableAddress, match="interface='lo'"):
        choose_scheduler_host(probe=lambda target: None)
