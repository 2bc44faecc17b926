"""Started with every Python of a peer's test (PYTHONPATH names this folder): the
subprocesses those tests start (scripts under mpirun) see hpcsched's names too."""

from tests.peers import shims

shims.install()
