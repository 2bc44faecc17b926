"""The pure rules of a worker's GPUs (core/worker/tasks/gpus.py): where they are found,
what a worker offers, what a program a task starts is shown; their doctests run here."""

from __future__ import annotations

import doctest

import pytest

from hpcsched.core.worker.tasks import gpus as gpus_module
from hpcsched.core.worker.tasks import time_limit
from hpcsched.core.worker.tasks.gpus import Gpus, find, offer_gpus, parse_nvidia_smi


@pytest.mark.parametrize("module", [gpus_module, time_limit])
def test_the_doctests_hold(module):
    failures, tried = doctest.testmod(module)
    assert tried and not failures


def test_the_environment_names_the_devices_first_and_nvidia_smi_last():
    smi = "GPU 0: A100 (UUID: GPU-a)\nGPU 1: A100 (UUID: GPU-b)\n"
    assert find({}, smi) == Gpus(("0", "1"), "CUDA_VISIBLE_DEVICES", "nvidia-smi -L")
    assert find({"CUDA_VISIBLE_DEVICES": "GPU-a"}, smi).ids == ("GPU-a",)
    assert find({"SLURM_JOB_GPUS": "gpu:1,gpu:3"}).ids == ("1", "3")
    assert find({"ZE_AFFINITY_MASK": "0.1"}).variable == "ZE_AFFINITY_MASK"
    assert find({"ROCR_VISIBLE_DEVICES": ""}, smi).ids == ()
    assert find({}, "No devices were found") is None and find({}) is None
    assert parse_nvidia_smi("  GPU 7: T4 (UUID: GPU-x)\n  MIG 1g.5gb Device 0: (UUID: MIG-y)") \
        == ("7",)


def test_a_worker_offers_what_it_found_or_the_first_of_them():
    res: dict = {"MEM": 1e9}
    assert offer_gpus(Gpus(("4", "5", "6")), res) == Gpus(("4", "5", "6"))
    assert res == {"MEM": 1e9, "GPU": 3}
    res = {"GPU": 2}
    assert offer_gpus(Gpus(("4", "5", "6"), "ROCR_VISIBLE_DEVICES"), res) == \
        Gpus(("4", "5"), "ROCR_VISIBLE_DEVICES")
    for told in (8, 0.5):  # more than found, or a fraction: counted, no device named
        res = {"GPU": told}
        assert offer_gpus(Gpus(("4",)), res) is None and res == {"GPU": told}
    assert offer_gpus(None, {}) is None and offer_gpus(Gpus(()), {}) is None


def test_a_program_is_shown_the_devices_it_is_given_in_the_vendors_variable():
    g = Gpus(("0", "2", "5"), "ROCR_VISIBLE_DEVICES")
    assert g.env(["2", "5"]) == {"ROCR_VISIBLE_DEVICES": "2,5"}
    assert g.env([]) == {"ROCR_VISIBLE_DEVICES": ""}
    assert g.ordinal("5") == 2
    assert g.one(4) == Gpus(("2",), "ROCR_VISIBLE_DEVICES", ", one per worker")
