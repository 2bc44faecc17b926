"""Bulk maps: ``Client.map`` over many elements, scheduled as ranges, not tasks.

A parameter sweep is one function over 10^5 to 10^7 arguments. Holding each call as a
:class:`~hpcsched.core.state.model.TaskState` costs the scheduler a kilobyte and tens of microseconds per
call; a task farm (mpi4py.futures with a ``chunksize``, HyperQueue's task arrays) ships
and tracks the calls in chunks. A :class:`BulkMap` does the same while every element
keeps its own key, ``f"{prefix}{i}"``, and its client its own future. This module
schedules them; the elements themselves are in :mod:`.elements` (a
:class:`~.elements.BulkMap` per map, its arrays, and the lookups by key):

* the map holds the function once, each element's pickled arguments, and per element a
  state byte (queued, processing, memory, promoted, forgotten), the worker running or
  holding it and its result's size, in flat arrays; the queued elements are a list of
  ranges;
* a worker is given a range of elements in one ``compute-range`` message, and again
  whenever what it holds of the maps runs low. The size of a range follows guided
  self-scheduling (Polychronopoulos and Kuck, 1987): the unassigned elements over four
  times the cluster's threads, at most :data:`~.handout.MAX_RANGE`, so that ranges are large while
  much is left (few messages) and shrink to single elements at the end (balanced); but
  once the map's elements have a measured time, a range holds at least
  :data:`~.handout.RANGE_SECONDS` of work: a thousand workers are not each given a few elements of
  microseconds (a message each way per few microseconds of work, and results spread
  over the cluster that later tasks must fetch). While no element of a map has
  finished, a map that arrives goes to :data:`~hpcsched.core.state.policies.FIRST_WAVE_WORKERS` free
  workers per event; the others get theirs from the next events (the server's
  ``FillQueue``), by when the first reports may have measured the elements;
* a worker reports many finished elements in one ``range-finished``; the client hears
  them in one ``map-in-memory``;
* an element gets its own ``TaskState`` only when it must, by an explicit call
  (:meth:`~hpcsched.core.state.tasks.TaskGraph.promote`, which asks
  :meth:`.promotion.Promotions.resolve`): when it
  failed, is a dependency of a new task, is cancelled, retried or lost its result's
  holder. A lookup never makes one: views see elements beside the tasks. From then on it is an ordinary task (its run spec is the map's
  function and its arguments) and the map forgets it ("promoted"). A queued element
  promoted stays in the queue, its task waiting ("held") until a range with it goes to
  a worker, which runs it with its neighbours: the additions of a tree reduction
  submitted over a map's futures find both inputs on one worker, where elements taken
  out to run alone, one per free worker, would spread them over the cluster;
* a worker that leaves takes its unfinished elements and the results only it held
  back to the queue (their clients hear ``lost-data`` of the results); the map keeps,
  per worker, the runs of elements given to it (:class:`Given`), so that a departure
  visits what that worker had, not the map;
* a worker gives back elements it has not started when asked (``release-range``,
  answered by ``range-released``: it either started an element or gives it up, so
  none runs twice by design or is lost): an idle worker steals half of what a busy one
  holds beyond its threads, while nothing is queued, when that is worth a round trip
  at the busy worker's speed (:meth:`.handout.Handout.steal`); a paused worker gives back
  everything not started; so does a retiring one, whose results become tasks of their
  own, moved to other workers as any result of a retiring worker is;
* a client that releases an element (its future was dropped) forgets it here without
  ever making a task of it.

What is not done for elements until they are promoted: worker restrictions and
resources (such maps go task by task). A worker's ``nbytes`` counts its elements'
results with its tasks' (``n_elements``, ``element_nbytes``), so that retirement,
rebalancing, adaptive scaling and the views weigh it right. A map with a future among
its arguments, even
one shared by every element, goes task by task: as a bulk map it would need the map to
hold its dependency (against its client's release, its loss, its failure: every element
errs) and a worker to fetch it before a range and keep it while the range runs.

The parts, each owning its data, behind :class:`~.maps.BulkMaps` (the scheduler state's
one view of them; its handlers take the maps' messages):

* :mod:`.elements`: the arrays of each map and the lookups by key (``ElementStore``);
* :mod:`.book`: the maps by prefix, their queue, the prefixes of dropped maps still
  named by tasks, and what clients forget (``MapBook``);
* :mod:`.handout`: ranges to workers, each worker's load of elements, hungry workers,
  stealing and release-range requests (``Handout``);
* :mod:`.promotion`: elements made tasks, and the tasks that ranges run (``Promotions``);
* :mod:`.reports`: what comes back: results, elements given back, departures and
  retirements (``Reports``).
"""

from hpcsched.core.state.bulk.handout import MAX_RANGE
from hpcsched.core.state.bulk.maps import BulkMaps

__all__ = ["MAX_RANGE", "BulkMaps"]
