"""IBM Spectrum LSF: ``bsub < script``, ``bkill``, ``bjobs -o ... -noheader``.

The script goes to ``bsub`` on stdin (``use_stdin=True``, LSF's usual way: the
``#BSUB`` lines are read only then). ``-M`` is in the unit ``LSF_UNIT_FOR_LIMITS``
of ``lsf.conf`` (found through ``LSF_ENVDIR``; KB when unset), or ``lsf_units``,
counted as dask-jobqueue counts it (``memory / 1000**k``, rounded up: LSF's units are
binary, so this never asks for less than ``memory``). ``-W`` is ``HH:MM`` (a walltime
of ``"00:30"`` means 30 minutes here, as LSF reads it), rounded up to a whole minute.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from typing_extensions import override

import hpcsched.jobqueue.runner as runner
from hpcsched.jobqueue.base import BatchSystem
from hpcsched.jobqueue.job import JobState, ceil_div, parse_memory

STATES: dict[str, JobState] = {
    **dict.fromkeys(["PEND", "PSUSP", "USUSP", "SSUSP", "WAIT", "PROV"], JobState.PENDING),
    "RUN": JobState.RUNNING,
    "DONE": JobState.DONE,
    "EXIT": JobState.FAILED,  # also what bkill leaves: see Job.cancel_requested
    **dict.fromkeys(["UNKWN", "ZOMBI"], JobState.UNKNOWN),
}

_UNIT_BYTES = {"KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
               "EB": 1000**6}


def lsf_units(envdir: str | None = None) -> str:
    """``LSF_UNIT_FOR_LIMITS`` from ``$LSF_ENVDIR/lsf.conf`` (or /etc/lsf.conf); KB if unset."""
    envdir = envdir if envdir is not None else os.environ.get("LSF_ENVDIR")
    candidates = [os.path.join(envdir, "lsf.conf")] if envdir else []
    candidates.append("/etc/lsf.conf")
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(r"^\s*LSF_UNIT_FOR_LIMITS\s*=\s*\"?([A-Za-z]+)\"?", text, re.MULTILINE)
        if m:
            return m.group(1).upper()
        return "KB"
    return "KB"


def lsf_format_bytes_ceil(nbytes: int, lsf_units: str = "mb") -> str:
    """``nbytes`` in ``lsf_units`` (``"kb"`` .. ``"eb"``), rounded up, as ``-M`` takes it.

    dask-jobqueue's helper of the same name, counting 1000s; a unit's first letter will do.

    >>> lsf_format_bytes_ceil(1234567890), lsf_format_bytes_ceil(13 * 10**9, "G")
    ('1235', '13')
    """
    unit = str(lsf_units).upper()
    unit = unit if unit.endswith("B") else unit + "B"
    if unit not in _UNIT_BYTES:
        raise ValueError(f"lsf_units={lsf_units!r}: use one of {', '.join(_UNIT_BYTES)}")
    return str(ceil_div(int(nbytes), _UNIT_BYTES[unit]))


def host_slots(env: Mapping[str, str], hostname: str) -> int | None:
    """Slots of this host in ``LSB_MCPU_HOSTS="hostA 4 hostB 2"``.

    >>> host_slots({"LSB_MCPU_HOSTS": "a.x 4 b.x 2"}, "b")
    2
    """
    text = env.get("LSB_MCPU_HOSTS", "").split()
    if len(text) % 2:
        raise ValueError(f"cannot read LSB_MCPU_HOSTS={env['LSB_MCPU_HOSTS']!r} "
                         "(expected 'host slots host slots ...')")
    short = hostname.split(".")[0]
    for host, slots in zip(text[::2], text[1::2], strict=True):
        if host == hostname or host.split(".")[0] == short:
            try:
                return int(slots)
            except ValueError:
                raise ValueError(f"LSB_MCPU_HOSTS gives host {host} {slots!r} slots") from None
    return None


class LSFSystem(BatchSystem):
    """IBM Spectrum LSF as a :class:`~hpcsched.jobqueue.base.BatchSystem`: its hooks."""

    system = "lsf"
    directive_prefix = "#BSUB"
    account_flag = "-P"
    submit_command = ["bsub"]
    cancel_command = ["bkill"]
    job_id_regex = r"Job <(?P<job_id>\d+)> is submitted"
    states = STATES
    array_index_var = "LSB_JOBINDEX"
    array_first_index = 1
    walltime_two_fields = "hh:mm"  # -W [hour:]minute
    #: dask-jobqueue's: ncpus / mem (bytes) to book when they differ from cores / memory
    extra_params = {"use_stdin": True, "lsf_units": None, "ncpus": None, "mem": None}
    job_id_variables = ("LSB_JOBID",)
    job_counts = {"node_cpus": ("LSB_DJOB_NUMPROC",)}  # unless LSB_MCPU_HOSTS names this host

    @classmethod
    @override
    def job_details(cls, env: Mapping[str, str], hostname: str) -> dict[str, Any]:
        return {"node_cpus": host_slots(env, hostname)}

    @override
    def validate_system(self) -> None:
        p = self.params
        units = str(p["lsf_units"] or lsf_units()).upper()
        units = units if units.endswith("B") else units + "B"  # dask-jobqueue's "mb" or "m"
        if units not in _UNIT_BYTES:
            raise ValueError(f"lsf_units / LSF_UNIT_FOR_LIMITS={units!r}: use one of "
                             f"{', '.join(_UNIT_BYTES)}")
        p["lsf_units"] = units
        if p["ncpus"] is not None and (isinstance(p["ncpus"], bool)
                                       or not isinstance(p["ncpus"], int) or p["ncpus"] < 1):
            raise ValueError(f"ncpus must be a positive integer, got {p['ncpus']!r}")
        self.booked_memory = self.memory_bytes
        if p["mem"] is not None:
            self.booked_memory = parse_memory(p["mem"], "mem")

    @override
    @property
    def script_on_stdin(self) -> bool:  # type: ignore[override]
        return bool(self.params["use_stdin"])

    @override
    def name_directives(self, job_name: str, log_file: str, array: int | None) -> list[str]:
        name = f'"{job_name}[1-{array}]"' if array else job_name
        return [f"-J {name}", f"-o {log_file}"]

    @override
    def array_directive(self, job_name: str, count: int) -> list[str]:
        return []  # part of -J

    @override
    def array_log_token(self) -> str:
        return "%I"

    @override
    def queue_account_directives(self) -> list[str]:
        p = self.params  # the project in quotes, as dask-jobqueue writes it (it may hold spaces)
        return ([f"-q {p['queue']}"] if p["queue"] else []) + \
            ([f'-P "{p["account"]}"'] if p["account"] else [])

    @override
    def resource_directives(self, ntasks: int) -> list[str]:
        p = self.params
        out = self.queue_account_directives()
        ncpus = p["ncpus"] or p["cores"]
        out.append(f"-n {ncpus}")
        if ncpus > 1 and ntasks == 1:
            out.append('-R "span[hosts=1]"')
        if p["resource_spec"]:
            out.append(f'-R "{p["resource_spec"]}"')
        out.append(f"-M {lsf_format_bytes_ceil(self.booked_memory, p['lsf_units'])}")
        if self.walltime_seconds:
            minutes = ceil_div(self.walltime_seconds, 60)
            out.append(f"-W {minutes // 60:02d}:{minutes % 60:02d}")
        return out

    @override
    def array_element_ids(self, parent: str, count: int) -> list[str]:
        return [f"{parent}[{i}]" for i in range(1, count + 1)]

    @override
    def query_ids(self, job_ids: list[str]) -> list[str]:
        return list(dict.fromkeys(j.split("[", 1)[0] for j in job_ids))

    @override
    def already_gone(self, error: runner.BatchCommandError) -> bool:
        text = error.stderr + error.stdout
        return any(s in text for s in ("is not found", "has already finished", "No matching job"))

    @override
    def job_output(self, log_text: str) -> str:
        # LSF adds a mail-like job report to the -o file: after the output
        # (LSB_STDOUT_DIRECT=Y) or before it, ending in "The output (if any) follows:"
        marker = "The output (if any) follows:"
        if marker in log_text:
            return log_text.split(marker, 1)[1]
        cut = log_text.rfind("\nSender: LSF System")
        if cut >= 0:
            dashes = log_text.rfind("\n---", 0, cut)
            report = log_text[cut:]
            status = [ln for ln in report.splitlines() if ln.startswith(("Exited", "Successfully",
                                                                        "TERM_"))]
            return log_text[:dashes if dashes >= 0 else cut] + "\n" + "\n".join(status)
        return log_text

    @override
    def status_command(self, job_ids: list[str]) -> list[str]:
        return ["bjobs", "-o", "jobid jobindex stat exit_code", "-noheader", *job_ids]

    @override
    def status_error_ok(self, error: runner.BatchCommandError) -> bool:
        lines = [ln for ln in error.stderr.splitlines() if ln.strip()]
        return bool(lines) and all("is not found" in ln for ln in lines)

    @override
    def parse_status(self, output: str) -> dict[str, tuple[str, int | None]]:
        out: dict[str, tuple[str, int | None]] = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) < 3 or not parts[0].isdigit() or "is not found" in line:
                continue
            job_id, index, stat = parts[0], parts[1], parts[2]
            code = parts[3] if len(parts) > 3 else "-"
            if index not in ("0", "-"):
                job_id = f"{job_id}[{index}]"
            out[job_id] = (stat, int(code) if code.lstrip("-").isdigit() and code != "-" else None)
        return out

