"""Which address a scheduler names so that workers on other nodes can reach it.

A batch job runs on some compute node; its worker connects back to the scheduler in
the client's process on the login node. ``127.0.0.1`` -- what a login node's name
often resolves to on Debian-style hosts (``127.0.1.1 login01`` in ``/etc/hosts``) --
reaches nothing there, and a login node often has several networks of which the
compute nodes reach one. So, in this order:

1. ``interface="ib0"`` (or ``scheduler_options={"interface": ...}``, ``hpcsched
   scheduler --interface``): that interface's IPv4 address; ``scheduler_options={"host":
   ...}`` (``--host``): that host. Both are the user's explicit choice, loopback included
   (``interface="lo"`` when every job runs on this very machine).
2. Otherwise the address this host reaches the compute nodes from: the source address
   of the route towards the nodes the batch system names (SLURM: the ``NodeAddr`` of the
   partition's nodes), which picks the cluster network on a login node with several.
3. Otherwise the source address of the default route, else the first IPv4 address of an
   interface that is up and not loopback (:func:`hpcsched.core.comm.hosts.routable_address`,
   as dask's ``distributed.utils.get_ip``).
4. Nothing but loopback: :class:`NoRoutableAddress`, naming the ways to choose.

:class:`HostChoice` keeps the reason, so that an error about workers that never
connected can say which address was tried and why.

    >>> choose_scheduler_host(toward=["10.77.0.11"], probe=lambda target: "10.77.0.1").how
    'the source address of the route to the compute node 10.77.0.11'
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hpcsched.core.comm.hosts import OUTSIDE, reachable, routable_address, route_source


class NoRoutableAddress(RuntimeError):
    """This host has no address that other nodes could reach."""


def interface_address(interface: str) -> str:
    """The IPv4 address of network interface ``interface`` (psutil.net_if_addrs)."""
    import psutil

    addrs = psutil.net_if_addrs()
    if interface not in addrs:
        raise ValueError(f"interface={interface!r} not found on this host; available: "
                         f"{', '.join(sorted(addrs))}")
    for a in addrs[interface]:
        if a.family == socket.AF_INET:
            return a.address
    raise ValueError(f"interface={interface!r} has no IPv4 address")


@dataclass(frozen=True)
class HostChoice:
    """The host a scheduler names, and how it was chosen (for messages)."""

    host: str
    how: str


def choose_scheduler_host(interface: str | None = None, host: str | None = None,
                          toward: Iterable[str] = (),
                          probe: Callable[[str], str | None] | None = None) -> HostChoice:
    """The host a scheduler for remote workers names (see the module docstring)."""
    if host:
        return HostChoice(host, f"the host given ({host})")
    if interface:
        return HostChoice(interface_address(interface), f"the address of interface {interface}")
    probe = probe or route_source
    for target in toward:
        if not reachable(target):  # a node on this very host (NodeAddr=127.0.0.1)
            continue
        ip = probe(target)
        if ip and reachable(ip):
            return HostChoice(ip, f"the source address of the route to the compute node {target}")
    ip = probe(OUTSIDE)
    if ip and reachable(ip):
        return HostChoice(ip, "the source address of this host's default route")
    ip = routable_address(probe=lambda target: None)
    if ip is None:
        raise NoRoutableAddress(
            "this host has no network address but loopback, so workers in batch jobs on other "
            "nodes could not reach the scheduler. Name an interface the compute nodes reach "
            "(interface='ib0', or scheduler_options={'interface': ...}) or a host "
            "(scheduler_options={'host': ...}); if every job runs on this machine, say so "
            "with interface='lo' or scheduler_options={'host': '127.0.0.1'}")
    return HostChoice(ip, "the first address of an interface that is up (no default route)")


def scheduler_host(interface: str | None = None, host: str | None = None,
                   toward: Iterable[str] = ()) -> str:
    """The host a scheduler for remote workers listens on and names in job scripts."""
    return choose_scheduler_host(interface, host, toward).host
