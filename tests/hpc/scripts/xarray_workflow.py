"""The pangeo workflow (tests/pangeo.py) on MPI worker ranks.

Under ``mpiexec -n 4 python -m hpcsched``: rank 0 runs the scheduler and this script,
ranks 1-3 the workers. The netCDF files are opened and read on the worker ranks (rank 0
refuses to open any while they compute), and every result equals xarray's own with
dask's synchronous scheduler. Each check prints one line the test reads.
"""

import tempfile

from hpcsched import Client
from tests.pangeo import FILES, assert_as_synchronous, compute_on, write_files

with tempfile.TemporaryDirectory() as tmp, Client() as client:
    paths = write_files(tmp)
    got = compute_on(client, paths, tmp)
    print(f"{FILES} files opened and read on {len(got['readers'])} worker ranks, "
          "none on rank 0", flush=True)
    assert_as_synchronous(got, paths, tmp)
    print("monthly, climatology, rolling and zarr equal to the synchronous scheduler's",
          flush=True)
