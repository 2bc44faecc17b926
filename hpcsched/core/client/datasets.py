"""Published datasets: ``Client.publish_dataset``, ``get_dataset``, ``list_datasets``,
``unpublish_dataset`` and the ``Client.datasets`` mapping, as distributed's
(https://distributed.dask.org/en/stable/publish.html)::

    client.publish_dataset(totals=client.submit(sum, range(10)))
    # later, from any client of the same scheduler
    client.get_dataset("totals").result()

A dataset lives on the scheduler (:mod:`hpcsched.core.scheduler.primitives`), which
keeps the futures inside it alive until it is unpublished, whoever published
it and whether that client is still connected.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from hpcsched.core.client.coordination import dumps_value, loads_value, request
from hpcsched.core.protocol import primitives as pp

if TYPE_CHECKING:
    from hpcsched.core.client.futures import FutureOwner as Client

NO_DEFAULT = object()


def publish_dataset(client: Client, args: tuple, name: str | None, override: bool,
                    kwargs: dict) -> None:
    if args:
        if name is None or len(args) != 1:
            raise ValueError("If name is provided, expecting call signature like "
                             "publish_dataset(df, name='ds')")
        kwargs = {**kwargs, name: args[0]}
    elif name is not None:
        raise ValueError("name= given without a dataset: publish_dataset(df, name='ds')")
    for key, value in kwargs.items():
        request(client, pp.DatasetPublish("", _name(key), override=bool(override),
                                          **dumps_value(value)))


def get_dataset(client: Client, name: str, default: Any = NO_DEFAULT) -> Any:
    try:
        reply = request(client, pp.DatasetGet("", _name(name)))
    except KeyError:
        if default is NO_DEFAULT:
            raise
        return default
    return loads_value(client, reply.blob, reply.keys)


def list_datasets(client: Client) -> list[str]:
    return list(request(client, pp.DatasetList("")).result)


def unpublish_dataset(client: Client, name: str) -> None:
    request(client, pp.DatasetUnpublish("", _name(name)))


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a dataset's name must be a non-empty string, got {name!r}")
    return name


class Datasets(MutableMapping):
    """``client.datasets``: the published datasets as a mapping (name -> value)."""

    def __init__(self, client: Client):
        self._client = client

    def __getitem__(self, name: str) -> Any:
        return get_dataset(self._client, name)

    def __setitem__(self, name: str, value: Any) -> None:
        publish_dataset(self._client, (value,), name, True, {})

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        unpublish_dataset(self._client, name)

    def __contains__(self, name: object) -> bool:
        return name in list_datasets(self._client)

    def __iter__(self) -> Iterator[str]:
        return iter(list_datasets(self._client))

    def __len__(self) -> int:
        return len(list_datasets(self._client))
