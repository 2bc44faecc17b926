"""``flux batch``, ``flux jobs``, ``flux cancel``, ``flux resource list``, ``flux kvs get``
of the Flux emulator.

Written from flux-core's manual pages (``flux-batch(1)``, ``flux-jobs(1)``,
``flux-cancel(1)``, ``flux-resource(1)``, ``flux-kvs(1)``; "Flux Standard Duration",
RFC 19 "Flux Locally Unique ID" for F58, RFC 20 for ``R``):

* ``flux batch [OPTIONS] SCRIPT`` reads the script's ``#flux:`` (or ``# flux:``) lines as
  options, the command line's winning; it prints the job's id in F58 (``ƒ`` and base58;
  ``FLUX_F58_FORCE_ASCII`` prints ``f``). Options: ``-N``, ``-n``, ``-c``, ``-t``
  (minutes, or FSD ``30s``/``2m``/``1h``/``1d``), ``-q``, ``--job-name``, ``--output``
  (stderr too unless ``--error``; ``{{id}}`` expands; default ``flux-{{id}}.out``),
  ``--setattr``. Queues: ``HPCSCHED_EMU_QUEUES`` (none by default: ``-q`` is an error).
* The job copies the submitter's environment (Flux's default) and gets ``FLUX_JOB_ID``
  and ``FLUX_URI`` (its own instance), which ``flux resource list`` and ``flux kvs get
  resource.R`` then answer for: its cores, and its expiration (start + time limit).
* ``flux jobs -a -n -o FORMAT IDS`` prints one line per job with ``{id.f58}``,
  ``{status}`` (SCHED, RUN, CLEANUP, COMPLETED, FAILED, CANCELED, TIMEOUT),
  ``{returncode}`` (empty while active); an unknown id is an error on stderr, exit 1.
* ``flux cancel IDS``: an inactive job is ``flux-cancel: ERROR: ID: job is inactive``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import emucore
import emusys
from emucore import EmulatorError

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
EPOCH = 1_700_000_000_000  # ms: the emulated instance's start (ids carry a timestamp)


def f58(number: int) -> str:
    """RFC 19's F58 encoding of a job id."""
    digits = ""
    while True:
        number, rest = divmod(number, 58)
        digits = ALPHABET[rest] + digits
        if not number:
            break
    return ("f" if os.environ.get("FLUX_F58_FORCE_ASCII") else "ƒ") + digits


def _job_id(seq: int) -> int:
    # RFC 19: 40 bits of milliseconds since the instance started, 10 of broker, 14 of seq
    return ((int(time.time() * 1000) - EPOCH) & (2**40 - 1)) << 24 | seq


def fsd(text: str, default_unit: float = 60.0) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if not m:
        raise EmulatorError(f"flux-batch: ERROR: invalid Flux standard duration '{text}'", 1)
    unit = {"": default_unit, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    return float(m.group(1)) * unit


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    short = {
        "-N": "nodes",
        "-n": "ntasks",
        "-c": "cores-per-task",
        "-t": "time-limit",
        "-q": "queue",
        "-o": "setopt",
        "-S": "setattr",
        "-g": "gpus-per-slot",
    }
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif arg.startswith("--") and i + 1 < len(argv):
            key, value = arg[2:], argv[i + 1]
            i += 1
        elif arg in short and i + 1 < len(argv):
            key, value = short[arg], argv[i + 1]
            i += 1
        elif arg.startswith("-"):
            raise EmulatorError(f"flux-batch: error: unrecognized arguments: {arg}", 2)
        else:
            return opts, argv[i:]
        opts[
            {
                "nslots": "ntasks",
                "cores-per-slot": "cores-per-task",
                "time": "time-limit",
                "job-name": "job-name",
            }.get(key, key)
        ] = value
        i += 1
    return opts, []


def batch(argv: list[str]) -> str:
    opts, rest = _options(argv)
    if len(rest) != 1:
        raise EmulatorError("flux-batch: ERROR: this emulator takes one batch script", 1)
    script = Path(rest[0]).resolve()
    try:
        text = script.read_text()
    except OSError:
        raise EmulatorError(f"flux-batch: ERROR: {rest[0]}: No such file or directory", 1) from None
    directives: list[str] = []
    for line in text.splitlines()[1:]:
        m = re.match(r"^\s*#\s*flux:\s*(.*)$", line)
        if m:
            directives += shlex.split(m.group(1))
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    opts = {**_options(directives)[0], **opts}
    queues = [q for q in os.environ.get("HPCSCHED_EMU_QUEUES", "").split(",") if q]
    if "queue" in opts and opts["queue"] not in queues:
        raise EmulatorError(f"flux-batch: ERROR: [Errno 22] invalid queue: {opts['queue']}", 1)
    walltime = fsd(opts["time-limit"]) if "time-limit" in opts else None
    cores = int(opts.get("ntasks", "1")) * int(opts.get("cores-per-task", "1"))
    cwd = os.getcwd()
    store = emucore.Store(emucore.state_dir("flux-batch"))
    ids: dict[int, int] = {}

    def jobid(seq: int) -> int:
        return ids.setdefault(seq, _job_id(seq))

    def log(seq: int, index: int | None) -> tuple[str, str | None]:
        name = f58(jobid(seq))
        out = opts.get("output", "flux-{{id}}.out").replace("{{id}}", name)
        err = opts.get("error", out).replace("{{id}}", name)
        out, err = (p if os.path.isabs(p) else os.path.join(cwd, p) for p in (out, err))
        return out, (None if err == out else err)

    def job_env(seq: int, index: int | None) -> dict[str, str]:
        return {
            "FLUX_JOB_ID": f58(jobid(seq)),
            "FLUX_URI": f"local://{store.root}/jobs/{seq}",
            "FLUX_JOB_SIZE": str(cores),
        }

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUX_")}
    seq = emusys.submit(
        "flux",
        store,
        ["/bin/sh", str(script)],
        env=env,
        log=log,
        cwd=cwd,
        walltime=walltime,
        job_env=job_env,
        fields=lambda s, i: {
            "name": opts.get("job-name", script.name),
            "f58": f58(jobid(s)),
            "cores": cores,
        },
    )
    return f58(jobid(seq))


def _by_id(store: emucore.Store) -> dict[str, dict]:
    out = {}
    for rec in store.records():
        if rec["system"] == "flux":
            out[rec["f58"]] = rec
            out["f" + rec["f58"][1:]] = rec  # either spelling names it
    return out


def _status(rec: dict) -> tuple[str, str]:
    state = rec["state"]
    if state in (emucore.QUEUED, emucore.HELD):
        return "SCHED", ""
    if state == emucore.RUNNING:
        return "RUN", ""
    if state == emucore.EXITING:
        return "CLEANUP", ""
    if rec["term_reason"] == "delete":
        return "CANCELED", "" if rec["never_ran"] else str(128 + (rec["signal"] or 15))
    if rec["term_reason"] == "walltime":
        return "TIMEOUT", str(128 + (rec["signal"] or 15))
    code = 128 + rec["signal"] if rec["signal"] else rec["exit_code"] or 0
    return ("COMPLETED" if code == 0 else "FAILED"), str(code)


def jobs(argv: list[str]) -> str:
    fmt = "{id.f58} {status} {returncode}"
    ids: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "-o" and i + 1 < len(argv):
            fmt = argv[i + 1]
            i += 1
        elif argv[i].startswith("--format="):
            fmt = argv[i].split("=", 1)[1]
        elif not argv[i].startswith("-"):
            ids.append(argv[i])
        i += 1
    store = emucore.Store(emucore.state_dir("flux-jobs"))
    known = _by_id(store)
    lines, unknown = [], []
    for job_id in ids or sorted({r["f58"] for r in known.values()}):
        rec = known.get(job_id)
        if rec is None:
            unknown.append(job_id)
            continue
        status, code = _status(rec)
        lines.append(
            fmt.replace("{id.f58}", rec["f58"])
            .replace("{id}", rec["f58"])
            .replace("{status}", status)
            .replace("{returncode}", code)
            .replace("{name}", str(rec.get("name", "")))
        )
    if unknown:
        raise (
            EmulatorError(
                "\n".join(lines)
                + "\n"
                + "\n".join(f"flux-jobs: ERROR: unknown job id {j}" for j in unknown),
                1,
            )
            if lines
            else EmulatorError(
                "\n".join(f"flux-jobs: ERROR: unknown job id {j}" for j in unknown), 1
            )
        )
    return "\n".join(lines)


def cancel(argv: list[str]) -> str:
    store = emucore.Store(emucore.state_dir("flux-cancel"))
    known = _by_id(store)
    errors = []
    for job_id in [a for a in argv if not a.startswith("-")]:
        rec = known.get(job_id)
        if rec is None:
            errors.append(f"flux-cancel: ERROR: {job_id}: unknown job id")
        elif rec["state"] == emucore.FINISHED:
            errors.append(f"flux-cancel: ERROR: {job_id}: job is inactive")
        else:
            emucore.request_kill(store, rec["key"])
    if errors:
        raise EmulatorError("\n".join(errors), 1)
    return ""


def _own_job(store: emucore.Store) -> dict:
    m = re.fullmatch(r"local://.*/jobs/(\d+)", os.environ.get("FLUX_URI", ""))
    rec = store.load(m.group(1)) if m else None
    if rec is None:
        raise EmulatorError(
            "flux-resource: ERROR: Unable to connect to Flux: "
            "broker socket /run/flux/local was not found",
            1,
        )
    return rec


def resource(argv: list[str]) -> str:
    if argv[:1] != ["list"]:
        raise EmulatorError("flux-resource: this emulator answers 'list' only", 1)
    store = emucore.Store(emucore.state_dir("flux-resource"))
    rec = _own_job(store)
    fmt = argv[argv.index("-o") + 1] if "-o" in argv else "{state} {ncores}"
    return (
        fmt.replace("{ncores}", str(rec["cores"]))
        .replace("{state}", "up")
        .replace("{nnodes}", "1")
        .replace("{nodelist}", emucore.hostname())
    )


def kvs(argv: list[str]) -> str:
    if argv != ["get", "resource.R"]:
        raise EmulatorError("flux-kvs: this emulator answers 'get resource.R' only", 1)
    store = emucore.Store(emucore.state_dir("flux-kvs"))
    rec = _own_job(store)
    start = rec["start_time"] or time.time()
    walltime = rec["run"].get("walltime")
    return json.dumps(
        {
            "version": 1,
            "execution": {
                "R_lite": [{"rank": "0", "children": {"core": f"0-{rec['cores'] - 1}"}}],
                "nodelist": [emucore.hostname()],
                "starttime": start,
                "expiration": start + walltime if walltime else 0.0,
            },
        }
    )


def flux(argv: list[str]) -> str:
    commands = {"batch": batch, "jobs": jobs, "cancel": cancel, "resource": resource, "kvs": kvs}
    if not argv or argv[0] not in commands:
        raise EmulatorError(
            f"flux: '{argv[0] if argv else ''}' is not a command this "
            f"emulator knows ({', '.join(commands)})",
            1,
        )
    return commands[argv[0]](argv[1:])
