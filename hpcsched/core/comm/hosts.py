"""This host's addresses: which one a peer on another node reaches, and how it was chosen.

A server that listens on every interface (``tcp://0.0.0.0:port``) still has to name
*one* address in what it tells its peers (a scheduler file, a worker's registration).
As dask does (``distributed.utils.get_ip``), it is the source address of a route:

1. towards a given host -- a worker takes the address it reaches its scheduler
   from, so that its peers on the same network reach it too; a batch cluster takes
   the address it reaches its compute nodes from;
2. else towards the outside (the default route);
3. else the first IPv4 address of an interface that is up and not loopback or
   link-local (a compute node with no default route);
4. else what this host's name resolves to, else ``127.0.0.1``.

Finding a route's source address sends nothing: ``connect()`` on a UDP socket only
asks the kernel's routing table.

    >>> routable_address(probe=lambda target: None,
    ...                  interfaces={"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"]})
    '10.1.2.3'
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence

#: a public address the default route leads to (no packet is sent to it)
OUTSIDE = "8.8.8.8"


def route_source(target: str) -> str | None:
    """The source address this host uses towards ``target`` (None: no route, no name)."""
    try:
        infos = socket.getaddrinfo(target, 80, socket.AF_INET, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(sockaddr)
                return str(s.getsockname()[0])
        except OSError:  # no route to it: an isolated network
            continue
    return None


def up_interfaces() -> dict[str, list[str]]:
    """IPv4 addresses of each interface that is up (``psutil.net_if_addrs``)."""
    import psutil

    stats = psutil.net_if_stats()
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()
            if name not in stats or stats[name].isup}


def describe_interfaces(interfaces: Mapping[str, Sequence[str]] | None = None) -> str:
    """``"eth0 10.1.2.3, ib0 10.2.0.5, lo 127.0.0.1"``: what a user may choose from."""
    ifaces = up_interfaces() if interfaces is None else interfaces
    return ", ".join(f"{name} {' '.join(addrs)}" for name, addrs in sorted(ifaces.items())
                     if addrs) or "(none with an IPv4 address)"


def routable_addresses(interfaces: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """Every address of this host another host could reach (more than one: a choice)."""
    ifaces = up_interfaces() if interfaces is None else interfaces
    return [a for name in sorted(ifaces) for a in ifaces[name] if reachable(a)]


def reachable(ip: str) -> bool:
    """Whether another host could reach ``ip``: not loopback, link-local or unspecified."""
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (a.is_loopback or a.is_link_local or a.is_unspecified)


def routable_address(toward: Iterable[str] = (),
                     probe: Callable[[str], str | None] | None = None,
                     interfaces: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Steps 1-3 of the module docstring; None when this host has only loopback."""
    probe = probe or route_source
    for target in [*toward, OUTSIDE]:
        ip = probe(target)
        if ip and reachable(ip):
            return ip
    ifaces = up_interfaces() if interfaces is None else interfaces
    for name in sorted(ifaces):
        for candidate in ifaces[name]:
            if reachable(candidate):
                return candidate
    return None


def contact_host(bound: str, toward: Iterable[str] = ()) -> str:
    """The host to name for a socket bound to ``bound`` (all steps of the docstring)."""
    if bound not in ("", "0.0.0.0", "::"):
        return bound
    ip = routable_address(toward)
    if ip:
        return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
