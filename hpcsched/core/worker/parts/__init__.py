"""The parts a worker server is made of, each owning its data: the link to the scheduler
(:mod:`.link`), the running tasks (:mod:`.running`), the heartbeats (:mod:`.heartbeats`),
and the typed items of the worker's inbox (:mod:`.inbox`)."""
