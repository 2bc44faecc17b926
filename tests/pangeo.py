"""The pangeo workflow, as a climate notebook runs it with a ``Client``: a year of daily
fields split over several netCDF files, ``open_mfdataset(parallel=True)``, a monthly
``resample().mean()``, a ``groupby("time.season")`` climatology, a ``rolling`` mean and
``to_zarr``.

:func:`compute_on` runs it on a cluster with the reads on the workers (each file opened
in a task, the workers counting the files their ``h5netcdf.File`` opened, the calling
process refusing to open any); :func:`assert_as_synchronous` compares its results with
xarray's own with dask's synchronous scheduler. The functions the workers run are here,
importable by them. Needs xarray, h5netcdf and zarr: a test skips without them before it
imports this module.
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr

ENGINE = "h5netcdf"
FILES = 6


def write_files(directory) -> list[str]:
    """A year of daily temperature, precipitation and wind on a 40 x 60 grid, in
    ``FILES`` netCDF files split along time (about 3 MB each)."""
    rng = np.random.default_rng(0)
    time = pd.date_range("2001-01-01", periods=365, freq="D")
    lat, lon = np.linspace(-60, 60, 40), np.linspace(0, 354, 60)
    season = np.cos(2 * np.pi * (time.day_of_year.values - 200) / 365)[:, None, None]
    shape = (len(time), len(lat), len(lon))
    ds = xr.Dataset(
        {"tas": (("time", "lat", "lon"), 280 + 15 * season + rng.normal(0, 3, shape)),
         "pr": (("time", "lat", "lon"), rng.gamma(0.8, 2.0, shape)),
         "wind": (("time", "lat", "lon"), rng.weibull(2.0, shape) * 7)},
        coords={"time": time, "lat": lat, "lon": lon})
    ds.tas.attrs["units"] = "K"
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(time)), FILES)):
        path = os.path.join(directory, f"day_{i}.nc")
        ds.isel(time=part).to_netcdf(path, engine=ENGINE)
        paths.append(path)
    return paths


def mark_reader(ds):
    """``preprocess``: runs where the file is opened, and says which process that is."""
    return ds.assign(reader=("time", np.full(ds.sizes["time"], os.getpid())))


def workflow(paths: list[str], store: str, parallel: bool) -> dict:
    """The notebook's steps; every result computed (and the zarr store read back)."""
    ds = xr.open_mfdataset(paths, engine=ENGINE, parallel=parallel, preprocess=mark_reader,
                           chunks={"time": 61}, combine="by_coords")
    fields = ds[["tas", "pr", "wind"]]
    monthly = fields.resample(time="1MS").mean()
    climatology = fields.groupby("time.season").mean()
    rolling = fields.tas.rolling(time=7, center=True).mean()
    monthly.to_zarr(store, mode="w", consolidated=False)
    return {"monthly": monthly.compute(), "climatology": climatology.compute(),
            "rolling": rolling.compute(),
            "zarr": xr.open_zarr(store, consolidated=False).compute(),
            "readers": set(ds.reader.values.tolist())}


OPENED: list[str] = []  # in a worker process: the files its h5netcdf opened


def count_opens() -> None:
    """On a worker: have ``h5netcdf.File`` record every file it opens in ``OPENED``."""
    import h5netcdf

    opened, original = OPENED, h5netcdf.File.__init__

    def counting(self, path, *args, **kwargs):
        opened.append(os.path.realpath(str(path)))
        original(self, path, *args, **kwargs)

    h5netcdf.File.__init__ = counting


def opened() -> list[str]:
    return list(OPENED)


def refuse(self, path, *args, **kwargs):
    raise AssertionError(f"{path} opened in the client's process")


def compute_on(client, paths: list[str], directory) -> dict:
    """The workflow on ``client``'s cluster (the default client, so dask's scheduler), with
    this process refusing to open the files: the workers open and read them all."""
    import h5netcdf

    pids = set(client.run(os.getpid).values())
    client.run(count_opens)
    with pytest.MonkeyPatch.context() as here:
        here.setattr(h5netcdf.File, "__init__", refuse)
        got = workflow(paths, os.path.join(directory, "cluster.zarr"), parallel=True)
    on_workers = client.run(opened)
    # every file was opened in a task on a worker (and read there: never in this process)
    assert got["readers"] <= pids and os.getpid() not in got["readers"], (got["readers"], pids)
    real = {os.path.realpath(p) for p in paths}
    assert set().union(*on_workers.values()) == real, on_workers
    assert sum(len(v) for v in on_workers.values()) >= FILES
    return got


def assert_as_synchronous(got: dict, paths: list[str], directory) -> None:
    """``got`` is what xarray computes with dask's synchronous scheduler."""
    with dask.config.set(scheduler="synchronous"):
        expected = workflow(paths, os.path.join(directory, "sync.zarr"), parallel=False)
    assert expected["readers"] == {os.getpid()}
    for name in ("monthly", "climatology", "rolling", "zarr"):
        xr.testing.assert_identical(got[name], expected[name])
    assert got["monthly"].sizes["time"] == 12 and got["climatology"].sizes["season"] == 4
