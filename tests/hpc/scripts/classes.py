"""Functions and classes defined in the script are used on the workers.

    classes.py functions   functions, and script classes made on workers, moving between them
    classes.py arguments   instances of script classes made here, sent as task arguments
"""

import sys
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
    return p.norm2()


def accumulate(acc, values):
    for v in values:
        acc.add(v)
    return acc.total


def total_of(start, values):
    return accumulate(Accumulator(start), values)  # script class used inside a task


with Client() as client:
    if sys.argv[1] == "functions":
        points = client.map(make_point, range(5))
        norms = client.map(norm2, points)  # worker-made instances flow between workers
        assert client.gather(norms) == [5 * i * i for i in range(5)]
        assert client.submit(total_of, 10, [1, 2, 3]).result(timeout=30) == 16
        back = client.gather(points)
        assert [(p.x, p.y) for p in back] == [(i, 2 * i) for i in range(5)]
        print("functions ok", flush=True)
    else:
        assert client.submit(norm2, Point(3, 4)).result(timeout=30) == 25
        assert client.submit(accumulate, Accumulator(10), [1, 2, 3]).result(timeout=30) == 16
        print("arguments ok", flush=True)
