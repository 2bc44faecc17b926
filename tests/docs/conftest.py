"""The site's examples that run against the real SLURM take the batch tests' fixture."""

from __future__ import annotations

from tests.jobqueue.conftest import slurm  # noqa: F401 - the fixture, used by name
