"""Which address a scheduler listens on so that workers on other nodes can reach it.

A batch job runs on some compute node; its worker connects back to the scheduler in
the client's process on the login node. ``127.0.0.1`` -- what a login node's name
often resolves to on Debian-style hosts (``127.0.1.1 login01`` in ``/etc/hosts``) --
reaches nothing there. So, as dask (``distributed.utils.get_ip``) does:

1. ``interface="ib0"`` (or ``scheduler_options={"interface": ...}``): that interface's
   IPv4 address; ``scheduler_options={"host": ...}``: that host. Both are the user's
   explicit choice, loopback included (``interface="lo"`` when every job runs on this
   very machine).
2. Otherwise the address the routing table would use towards the outside (a UDP
   socket "connected" to a public address: no packet is sent), else the first IPv4
   address of an interface that is up and not loopback or link-local.
3. Nothing but loopback: :class:`NoRoutableAddress`, naming the ways to choose.

    >>> routable_address(probe=lambda: None,
    ...                  interfaces={"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"]})
    '10.1.2.3'
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence


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


def _probe_route(target: str = "8.8.8.8") -> str | None:
    """Source address of the default route (connect() on UDP sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 80))
            return s.getsockname()[0]
    except OSError:  # no route: an isolated host
        return None


def _up_interfaces() -> dict[str, list[str]]:
    import psutil

    stats = psutil.net_if_stats()
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()
            if name not in stats or stats[name].isup}


def _reachable(ip: str) -> bool:
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (a.is_loopback or a.is_link_local or a.is_unspecified)


def routable_address(probe: Callable[[], str | None] | None = None,
                     interfaces: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """This host's address that other nodes can reach, or None (see the module docstring)."""
    ip = (probe or _probe_route)()
    if ip and _reachable(ip):
        return ip
    ifaces = _up_interfaces() if interfaces is None else interfaces
    for name in sorted(ifaces):
        for candidate in ifaces[name]:
            if _reachable(candidate):
                return candidate
    return None


def scheduler_host(interface: str | None = None, host: str | None = None,
                   find: Callable[[], str | None] | None = None) -> str:
    """The host a scheduler for remote workers listens on and names in job scripts."""
    if host:
        return host
    if interface:
        return interface_address(interface)
    ip = (find or routable_address)()
    if ip is None:
        raise NoRoutableAddress(
            "this host has no network address but loopback, so workers in batch jobs on other "
            "nodes could not reach the scheduler. Name an interface the compute nodes reach "
            "(interface='ib0', or scheduler_options={'interface': ...}) or a host "
            "(scheduler_options={'host': ...}); if every job runs on this machine, say so "
            "with interface='lo' or scheduler_options={'host': '127.0.0.1'}")
    return ip
