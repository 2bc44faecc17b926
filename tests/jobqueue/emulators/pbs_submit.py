"""``qsub`` of the PBS Professional / OpenPBS emulator: options, directives, resources.

Written from the OpenPBS sources and man pages (``doc/man1/qsub.1B``,
``src/cmds/qsub.c``, ``src/include/pbs_error.h``, ``src/lib/Liblog/pbs_messages.c``):

* ``qsub [opts] script``, ``qsub [opts] < script`` (job name ``STDIN``) and
  ``qsub [opts] -- executable args``; ``#PBS`` directives (prefix from ``-C`` or
  ``PBS_DPREFIX``) are read up to the first executable line; command-line options win over
  directives, ``-l`` resources are merged name by name.
* Success prints ``<seq>.<server>`` (arrays: ``<seq>[].<server>``); the server name is
  ``emu-pbs`` (``HPCSCHED_EMU_PBS_SERVER`` overrides it).
* Errors the client detects (bad ``-l`` syntax, bad ``-N``, bad ``-J``, unknown option)
  print ``qsub: illegal -X value`` plus usage and exit 2. Errors the server returns print
  ``qsub: <pbs error text>[ <attribute>]`` and exit with the PBS error number modulo 256,
  as qsub does (``exit(pbs_errno)``): ``Unknown queue`` -> 170, ``Illegal attribute or
  resource value Resource_List.walltime`` -> 166, ``Unknown resource`` -> 187.
* Queues: ``workq`` (``HPCSCHED_EMU_QUEUES=workq,debug`` configures the list, first is the
  default). The job starts in ``$HOME`` as on a real PBS node, with a login-like environment
  (``-V`` exports the whole submission environment, ``-v`` single variables) plus
  ``PBS_O_*`` and the execution variables (``PBS_JOBID``, ``PBS_JOBNAME``, ``PBS_NODEFILE``,
  ``NCPUS``, ``OMP_NUM_THREADS``, ``TMPDIR``, ``PBS_ARRAY_INDEX`` ...).
* Output goes straight to the final files (as with ``-k od``): default
  ``<workdir>/<name>.o<seq>`` / ``.e<seq>`` (subjobs ``.o<seq>.<index>``), ``-j oe``/``eo``
  joins, ``^array_index^`` in ``-o``/``-e`` paths is replaced.
"""

from __future__ import annotations

import getopt
import os
import re
import shlex
import stat
import sys
import time
from pathlib import Path

import emucore
from emucore import EmulatorError

PBS_VERSION = "22.05.11"
PBSE_BADATVAL = 15014
PBSE_UNKQUE = 15018
PBSE_UNKRESC = 15035
OPTSTRING = "a:A:c:C:e:fhIj:J:k:l:m:M:N:o:p:P:q:r:R:S:u:v:VW:Xz"
USAGE = """usage: qsub [-a date_time] [-A account_string] [-c interval]
\t[-C directive_prefix] [-e path] [-f ] [-h ] [-I [-X]] [-j oe|eo] [-J X-Y[:Z]]
\t[-k keep] [-l resource_list] [-m mail_options] [-M user_list]
\t[-N jobname] [-o path] [-p priority] [-P project] [-q queue] [-r y|n]
\t[-R o|e|oe] [-S path] [-u user_list] [-W otherattributes=value...]
\t[-v variable_list] [-V ] [-z] [script | -- command [arg1 ...]]
       qsub --version
"""

JOB_RESOURCES = {
    "ncpus", "mem", "vmem", "pmem", "pvmem", "walltime", "cput", "pcput", "select", "place",
    "nodes", "ngpus", "mpiprocs", "ompthreads", "host", "vnode", "arch", "software", "file",
    "nice", "nodect", "max_walltime", "min_walltime", "naccelerators", "accelerator",
    "accelerator_model", "accelerator_memory", "preempt_targets", "site",
}
CHUNK_RESOURCES = {
    "ncpus", "mem", "vmem", "ngpus", "mpiprocs", "ompthreads", "host", "vnode", "arch",
    "naccelerators", "accelerator", "accelerator_model", "accelerator_memory",
}
TIME_RE = re.compile(r"^(\d+:){0,2}\d+(\.\d+)?$")
SIZE_RE = re.compile(r"^(\d+)([kmgtp]?)(b|w)?$", re.IGNORECASE)
INT_RESOURCES = {"ncpus", "ngpus", "mpiprocs", "ompthreads", "nodect", "naccelerators", "nice"}
SIZE_RESOURCES = {"mem", "vmem", "pmem", "pvmem", "accelerator_memory"}
TIME_RESOURCES = {"walltime", "cput", "pcput", "max_walltime", "min_walltime"}
PLACE_WORDS = {"free", "pack", "scatter", "vscatter", "excl", "shared", "exclhost"}


def server_name() -> str:
    return os.environ.get("HPCSCHED_EMU_PBS_SERVER", "emu-pbs")


def queues() -> list[str]:
    names = [q.strip() for q in os.environ.get("HPCSCHED_EMU_QUEUES", "workq").split(",")]
    return [q for q in names if q] or ["workq"]


def server_error(code: int, text: str) -> EmulatorError:
    return EmulatorError(f"qsub: {text}", code % 256)


def client_error(what: str) -> EmulatorError:
    return EmulatorError(f"qsub: {what}\n{USAGE}".rstrip("\n"), 2)


def parse_seconds(value: str) -> int:
    """``[[HH:]MM:]SS[.ms]`` to whole seconds (rounded up, as limits are)."""
    total = 0.0
    for part in value.split(":"):
        total = total * 60 + float(part)
    return int(total) if total == int(total) else int(total) + 1


def hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def size_kb(value: str) -> int:
    m = SIZE_RE.match(value)
    assert m is not None
    number, scale, unit = int(m.group(1)), m.group(2).lower(), (m.group(3) or "b").lower()
    nbytes = number << (10 * " kmgtp".index(scale or " "))
    if unit == "w":
        nbytes *= 8
    return (nbytes + 1023) // 1024


def format_kb(kb: int) -> str:
    for unit, factor in (("tb", 1 << 30), ("gb", 1 << 20), ("mb", 1 << 10)):
        if kb % factor == 0 and kb >= factor:
            return f"{kb // factor}{unit}"
    return f"{kb}kb"


# ---------------------------------------------------------------------------------------
# resources


def split_l(value: str, resources: dict[str, str]) -> None:
    """Merge one ``-l`` argument into ``resources`` (client-side syntax check)."""
    for token in value.split(","):
        name, sep, val = token.partition("=")
        if not sep or not name.strip() or not val:
            raise client_error("illegal -l value")
        resources[name.strip()] = val.strip()


def check_value(name: str, value: str) -> bool:
    if name in INT_RESOURCES:
        return value.isdigit()
    if name in SIZE_RESOURCES:
        return SIZE_RE.match(value) is not None
    if name in TIME_RESOURCES:
        return TIME_RE.match(value) is not None
    return bool(value)


def parse_select(value: str) -> list[tuple[int, dict[str, str]]]:
    chunks = []
    for spec in value.split("+"):
        parts = spec.split(":")
        count = 1
        if parts and parts[0].isdigit():
            count = int(parts.pop(0))
        chunk: dict[str, str] = {}
        for part in parts:
            name, sep, val = part.partition("=")
            if not sep:
                raise server_error(PBSE_BADATVAL,
                                   "Illegal attribute or resource value Resource_List.select")
            if name not in CHUNK_RESOURCES:
                raise server_error(PBSE_UNKRESC, f"Unknown resource Resource_List.{name}")
            if not check_value(name, val):
                raise server_error(PBSE_BADATVAL,
                                   "Illegal attribute or resource value Resource_List.select")
            chunk[name] = val
        if count < 1:
            raise server_error(PBSE_BADATVAL,
                               "Illegal attribute or resource value Resource_List.select")
        chunks.append((count, chunk))
    return chunks


def resolve_resources(raw: dict[str, str]) -> tuple[dict[str, object], list]:
    """Validate ``-l`` resources as the server does; return Resource_List and chunks."""
    for name, value in raw.items():
        if name not in JOB_RESOURCES:
            raise server_error(PBSE_UNKRESC, f"Unknown resource Resource_List.{name}")
        if name != "select" and not check_value(name, value):
            raise server_error(PBSE_BADATVAL,
                               f"Illegal attribute or resource value Resource_List.{name}")
    if "place" in raw:
        words = raw["place"].split(":")
        if not all(w in PLACE_WORDS or w.startswith("group=") for w in words):
            raise server_error(PBSE_BADATVAL,
                               "Illegal attribute or resource value Resource_List.place")
    if "select" in raw:
        chunks = parse_select(raw["select"])
    else:
        # old-style job-wide ncpus/mem become one chunk, as the server converts them
        chunk = {"ncpus": raw.get("ncpus", "1")}
        if "mem" in raw:
            chunk["mem"] = raw["mem"]
        chunks = [(1, chunk)]
    ncpus = sum(n * int(c.get("ncpus", "1")) for n, c in chunks)
    mem_kb = sum(n * size_kb(c["mem"]) for n, c in chunks if "mem" in c)
    resource_list: dict[str, object] = {}
    for name, value in raw.items():
        resource_list[name] = int(value) if name in INT_RESOURCES else value
    resource_list["ncpus"] = ncpus
    resource_list["nodect"] = sum(n for n, _ in chunks)
    resource_list.setdefault("place", "pack")
    if mem_kb:
        resource_list["mem"] = format_kb(mem_kb)
    resource_list["select"] = "+".join(
        ":".join([str(n)] + [f"{k}={v}" for k, v in c.items()]) for n, c in chunks
    )
    if "walltime" in raw:
        resource_list["walltime"] = hms(parse_seconds(raw["walltime"]))
    return dict(sorted(resource_list.items())), chunks


# ---------------------------------------------------------------------------------------
# options and directives


def read_directives(script: str, prefix: str) -> list[tuple[str, str]]:
    opts: list[tuple[str, str]] = []
    if not prefix:
        return opts
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith(prefix) and (
            len(stripped) == len(prefix) or stripped[len(prefix)].isspace()
        ):
            try:
                words = shlex.split(stripped[len(prefix):])
            except ValueError as exc:
                raise client_error(f"directive error: {exc}") from None
            found, rest = parse_options(words)
            if rest:
                raise client_error(f"directive error: {stripped}")
            opts.extend(found)
        elif stripped and not stripped.startswith("#"):
            break  # directives end at the first executable line
    return opts


def parse_options(argv: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    try:
        found, rest = getopt.getopt(argv, OPTSTRING)
    except getopt.GetoptError as exc:
        raise EmulatorError(f"qsub: {exc.msg}\n{USAGE}".rstrip("\n"), 2) from None
    return found, rest


UNSUPPORTED = {"-a": "deferred start (-a)", "-I": "interactive jobs (-I)", "-X": "X11 (-X)"}


def build_job(opts: list[tuple[str, str]]) -> dict:
    """Fold the option list (directives first, then the command line) into settings."""
    job: dict = {"resources": {}, "variables": [], "V": False, "hold": False, "z": False,
                 "W": {}}
    for opt, val in opts:
        if opt in UNSUPPORTED:
            raise EmulatorError(f"qsub: {UNSUPPORTED[opt]} is not supported by the emulator", 2)
        if opt == "-l":
            split_l(val, job["resources"])
        elif opt == "-v":
            job["variables"].extend(v for v in val.split(",") if v)
        elif opt == "-V":
            job["V"] = True
        elif opt == "-h":
            job["hold"] = True
        elif opt == "-z":
            job["z"] = True
        elif opt == "-W":
            for item in val.split(","):
                name, _, value = item.partition("=")
                job["W"][name.strip()] = value.strip()
        elif opt == "-N":
            if not re.match(r"^[A-Za-z0-9]\S*$", val) or len(val) > 236:
                raise client_error("illegal -N value")
            job["N"] = val
        elif opt == "-J":
            m = re.match(r"^(\d+)-(\d+)(?::(\d+))?$", val)
            if not m or int(m.group(1)) > int(m.group(2)) or (m.group(3) and int(m.group(3)) < 1):
                raise client_error("illegal -J value")
            job["J"] = val
        elif opt == "-j":
            if val not in ("oe", "eo", "n"):
                raise client_error("illegal -j value")
            job["j"] = val
        else:
            job[opt[1:]] = val
    if "depend" in job["W"]:
        raise EmulatorError("qsub: job dependencies (-W depend) are not supported by the emulator", 2)
    return job


def array_indices(spec: str) -> list[int]:
    m = re.match(r"^(\d+)-(\d+)(?::(\d+))?$", spec)
    assert m is not None
    return list(range(int(m.group(1)), int(m.group(2)) + 1, int(m.group(3) or 1)))


def resolve_path(value: str | None, workdir: str, default_name: str, seq: int,
                 index: int | None, suffix: str) -> str:
    """Where an output stream goes: ``[host:]path``, relative to the submit directory."""
    if value is None:
        path = Path(workdir) / default_name
    else:
        if ":" in value and not value.startswith("/"):
            value = value.split(":", 1)[1]
        if index is not None:
            value = value.replace("^array_index^", str(index))
        path = Path(value) if os.path.isabs(value) else Path(workdir) / value
        if path.is_dir():
            path = path / f"{seq}.{server_name()}.{suffix}"
    return str(path)


def login_env(job: dict) -> dict[str, str]:
    """The environment a job starts with before PBS adds its own variables."""
    if job["V"]:
        env = dict(os.environ)
    else:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        for name in ("HOME", "LOGNAME", "USER", "SHELL", "LANG", "TZ", "MAIL"):
            if name in os.environ:
                env[name] = os.environ[name]
    return env


def variable_list(job: dict, workdir: str, queue: str) -> dict[str, str]:
    variables: dict[str, str] = {}
    for name in ("HOME", "LANG", "LOGNAME", "PATH", "MAIL", "SHELL", "TZ"):
        if name in os.environ:
            variables[f"PBS_O_{name}"] = os.environ[name]
    variables["PBS_O_WORKDIR"] = workdir
    variables["PBS_O_HOST"] = emucore.hostname()
    variables["PBS_O_SYSTEM"] = os.uname().sysname
    variables["PBS_O_QUEUE"] = queue
    if job["V"]:
        for name, value in os.environ.items():
            variables.setdefault(name, value)
    for item in job["variables"]:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise EmulatorError("qsub: cannot send environment with the job", 1)
            value = os.environ[name]
        variables[name] = value.strip("'\"")
    return variables


def qsub(argv: list[str], stdin_text: str | None) -> str:
    if argv == ["--version"]:
        return f"pbs_version = {PBS_VERSION}"
    root = emucore.state_dir("qsub")
    store = emucore.Store(root)
    workdir = os.getcwd()
    cli, rest = parse_options(argv)
    command: list[str] | None = None
    if argv and "--" in argv and rest == argv[argv.index("--") + 1:]:
        command = rest
        if not command:
            raise client_error("no executable given after --")
        script, script_name = "", None
    elif rest and rest[0] != "-":
        if len(rest) > 1:
            raise client_error(f"unexpected argument {rest[1]}")
        path = Path(rest[0])
        try:
            script = path.read_text()
        except OSError:
            raise EmulatorError("qsub: script file:: No such file or directory", 1) from None
        script_name = path.name
    else:
        script, script_name = stdin_text or "", "STDIN"
    prefix = dict(cli).get("-C", os.environ.get("PBS_DPREFIX", "#PBS"))
    job = build_job(read_directives(script, prefix) + cli)
    name = job.get("N") or (script_name if script_name else Path(command[0]).name)
    queue = job.get("q", "").split("@")[0] or queues()[0]
    if queue not in queues():
        raise server_error(PBSE_UNKQUE, "Unknown queue")
    resource_list, chunks = resolve_resources(job["resources"])
    walltime = parse_seconds(job["resources"]["walltime"]) if "walltime" in job["resources"] else None
    variables = variable_list(job, workdir, queue)
    max_running = emucore.submit_env_settings(store)
    indices = array_indices(job["J"]) if "J" in job else None
    with store.locked():
        seq = store.next_seq()
    server = server_name()
    script_path = root / "scripts" / f"{seq}.SC"
    script_path.parent.mkdir(exist_ok=True)
    script_path.write_text(script)
    script_path.chmod(stat.S_IRWXU)
    attrs = {
        "Job_Name": name,
        "Job_Owner": f"{emucore.username()}@{emucore.hostname()}",
        "queue": queue,
        "Account_Name": job.get("A"),
        "project": job.get("P", "_pbs_project_default"),
        "Checkpoint": job.get("c", "u"),
        "Hold_Types": "u" if job["hold"] else "n",
        "Join_Path": job.get("j", "n"),
        "Keep_Files": job.get("k", "n"),
        "Mail_Points": job.get("m", "a"),
        "Priority": int(job.get("p", "0")),
        "Rerunable": "False" if job.get("r") == "n" else "True",
        "Resource_List": resource_list,
        "Variable_List": variables,
        "Submit_arguments": " ".join(shlex.quote(a) for a in argv) or "<stdin>",
        "Submit_Host": emucore.hostname(),
        "W": job["W"],
    }
    common = {"name": name, "queue": queue, "max_running": max_running,
              "user_hold": job["hold"], "pbs": attrs, "workdir": workdir,
              "array_spec": job.get("J")}
    if indices is None:
        recs = [_job_record(seq, None, job, common, chunks, walltime, command, script_path)]
        printed = f"{seq}.{server}"
    else:
        parent = emucore.new_record("pbs", seq, None, array=True, indices=indices, **common)
        parent["state"] = emucore.QUEUED
        recs = [parent] + [
            _job_record(seq, i, job, common, chunks, walltime, command, script_path)
            for i in indices
        ]
        printed = f"{seq}[].{server}"
    with store.locked():
        for rec in recs:
            store.save(rec)
    for rec in recs:
        if not rec["array"]:
            emucore.spawn_supervisor(store, rec["key"])
    if job["W"].get("block", "").lower() == "true":
        return _block(store, recs, printed, job["z"])
    return "" if job["z"] else printed


def _block(store: emucore.Store, recs: list[dict], printed: str, quiet: bool) -> str:
    """``-W block=true``: print the id, wait for the end, exit with the job's status."""
    if not quiet:
        print(printed, flush=True)
    keys = [r["key"] for r in recs if not r["array"]]
    while True:
        states = [store.load(k) for k in keys]
        if all(s is None or s["state"] == emucore.FINISHED for s in states):
            break
        time.sleep(emucore.POLL)
    import pbs_status

    codes = [pbs_status.exit_status(s) for s in states if s is not None]
    code = next((c for c in codes if c), 0) if codes else 3
    raise EmulatorError("", (code if code is not None else 3) % 256)


def _job_record(seq: int, index: int | None, job: dict, common: dict, chunks: list,
                walltime: int | None, command: list[str] | None, script_path: Path) -> dict:
    server = server_name()
    root = script_path.parent.parent
    jobid = f"{seq}.{server}" if index is None else f"{seq}[{index}].{server}"
    name = common["name"]
    workdir = common["workdir"]
    suffix_o = f"o{seq}" if index is None else f"o{seq}.{index}"
    suffix_e = f"e{seq}" if index is None else f"e{seq}.{index}"
    out = resolve_path(job.get("o"), workdir, f"{name}.{suffix_o}", seq, index, "OU")
    err = resolve_path(job.get("e"), workdir, f"{name}.{suffix_e}", seq, index, "ER")
    join = job.get("j", "n")
    first_count, first = chunks[0]
    ncpus = int(first.get("ncpus", "1"))
    host = emucore.hostname()
    nodefile = root / "aux" / jobid
    tmpdir = root / "tmp" / f"pbs.{jobid}"
    lines = []
    for count, chunk in chunks:
        lines += [host] * (count * int(chunk.get("mpiprocs", "1")))
    env = login_env(job)
    env.update(common["pbs"]["Variable_List"])
    env.update({
        "PBS_ENVIRONMENT": "PBS_BATCH", "ENVIRONMENT": "BATCH", "PBS_JOBID": jobid,
        "PBS_JOBNAME": name, "PBS_QUEUE": common["queue"], "PBS_NODEFILE": str(nodefile),
        "PBS_JOBDIR": env.get("HOME", "/"), "TMPDIR": str(tmpdir), "NCPUS": str(ncpus),
        "OMP_NUM_THREADS": first.get("ompthreads", str(ncpus)), "PBS_TASKNUM": "1",
        "PBS_NODENUM": "0", "PBS_MOMPORT": "15003", "PBS_JOBCOOKIE": os.urandom(16).hex().upper(),
    })
    if index is not None:
        env["PBS_ARRAY_INDEX"] = str(index)
        env["PBS_ARRAY_ID"] = f"{seq}[].{server}"
    home = env.get("HOME", "/")
    if command is not None:
        argv = list(command)
    elif job.get("S"):
        argv = [job["S"].split("@")[0].split(",")[0], str(script_path)]
    elif script_path.read_text().startswith("#!"):
        argv = [str(script_path)]
    else:
        argv = [os.environ.get("SHELL", "/bin/sh"), str(script_path)]
    stdout, stderr = out, err
    if join == "oe":
        stderr = None
    elif join == "eo":
        stdout, stderr = err, None
    run = {
        "argv": argv, "cwd": home if os.path.isdir(home) else "/", "env": env,
        "stdout": stdout, "stderr": stderr, "stdout_mode": "w", "stderr_mode": "w",
        "stderr_file": stderr or stdout,
        "files": {str(nodefile): "".join(f"{h}\n" for h in lines)},
        "mkdirs": [str(tmpdir)], "cleanup": [str(nodefile)],
        "walltime": walltime,
        "walltime_message": f"=>> PBS: job killed: walltime {{used}} exceeded limit {walltime}\n",
        "kill_signals": {"delete": ["SIGTERM", "SIGKILL"], "walltime": ["SIGTERM", "SIGKILL"]},
    }
    rec = emucore.new_record("pbs", seq, index, run=run, jobid=jobid, **common)
    rec["output_path"] = out
    rec["error_path"] = err
    rec["exec_ncpus"] = sum(n * int(c.get("ncpus", "1")) for n, c in chunks)
    rec["first_chunk_count"] = first_count
    return rec


def main() -> None:
    argv = sys.argv[1:]
    stdin_text = None
    try:
        if argv != ["--version"]:
            _, rest = parse_options(argv)
            if (not rest or rest == ["-"]) and "--" not in argv:
                stdin_text = sys.stdin.read() if sys.stdin is not None else ""
        out = qsub(argv, stdin_text)
    except EmulatorError as exc:
        if exc.message:
            print(exc.message, file=sys.stderr)
        sys.exit(exc.code)
    if out:
        print(out)
