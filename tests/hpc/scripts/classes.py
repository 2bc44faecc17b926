"""Functions and classes defined in the script are used on the workers."""

from dataclasses import dataclass

from hpcsched import Client


@dataclass
class Point:
    x: float
    y: float

    def norm2(self) -> float:
        return self.x * self.x + self.y * self.y


class Accumulator:
    def __init__(self, start):
        self.total = start

    def add(self, value):
        self.total += value
        return self


def make_point(i):
    return Point(i, 2 * i)  # a script class created on a worker


def norm2(p):
    return p.norm2()  # a script class received as an argument on a worker


def accumulate(acc, values):
    for v in values:
        acc.add(v)
    return acc.total


with Client() as client:
    points = client.map(make_point, range(5))
    norms = client.map(norm2, points)  # worker-made instances flow between workers
    assert client.gather(norms) == [5 * i * i for i in range(5)], client.gather(norms)
    direct = client.submit(norm2, Point(3, 4))  # a client-made instance as an argument
    assert direct.result(timeout=30) == 25
    total = client.submit(accumulate, Accumulator(10), [1, 2, 3]).result(timeout=30)
    assert total == 16, total
    back = client.gather(points)
    assert [(p.x, p.y) for p in back] == [(i, 2 * i) for i in range(5)]
    print(f"classes ok: {type(back[0]).__name__}", flush=True)
