"""``bsub`` of the IBM Spectrum LSF emulator: options, ``#BSUB`` directives, limits.

Written from the IBM Spectrum LSF 10.1 command reference (bsub, bjobs -o/-json,
LSB_BJOBS_CONSISTENT_EXIT_CODE, lsf.conf) and the OpenLava sources (the open-source LSF
lineage: ``lsbatch/cmd/cmd.sig.c``, ``bjobs.c``):

* ``bsub [opts] < script`` reads ``#BSUB`` directives from the script (up to the first
  line that is neither blank nor a comment); ``bsub [opts] command [args]`` runs the
  command through ``/bin/sh -c`` and does not read the file, unless
  ``LSB_BSUB_PARSE_SCRIPT=Y`` (environment or ``lsf.conf``). Command-line options override
  directives.
* Success prints ``Job <N> is submitted to queue <q>.`` (``-q`` given) or
  ``Job <N> is submitted to default queue <normal>.``; an unknown queue prints
  ``<q>: No such queue. Job not submitted.`` on stderr, exit 255. Queues: ``normal``
  (``HPCSCHED_EMU_QUEUES`` configures the list, first is the default).
* ``-J "name[1-4]"`` (also ``1-10:2``, ``1,3,5``, ``%limit``) makes a job array; each
  element gets ``LSB_JOBINDEX``. ``-o``/``-oo``/``-e``/``-eo`` (``%J``, ``%I``
  substituted; a directory means ``<dir>/<jobid>.out``/``.err``; ``-o`` without ``-e``
  receives stderr too). Without ``-o`` LSF mails the output: the emulator writes that mail
  to ``$HPCSCHED_EMU_STATE/mail/<jobid>[.<index>]``. Output is written directly
  (``LSB_STDOUT_DIRECT=Y``) and LSF's job report is appended at the end.
* ``-n N`` slots (``LSB_DJOB_NUMPROC``, ``LSB_MCPU_HOSTS="host N"``, ``LSB_HOSTS``),
  ``-W [HH:]MM`` run limit (SIGUSR2, then SIGKILL after the grace period; ``EXIT`` with
  ``TERM_RUNLIMIT``), ``-M`` and ``-R "rusage[mem=..]"`` in ``LSF_UNIT_FOR_LIMITS`` from
  ``$LSF_ENVDIR/lsf.conf`` (default KB; recorded, not enforced), ``-P``, ``-cwd``, ``-env``,
  ``-H`` (held: ``PSUSP``). The job inherits the submission environment and directory.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import sys
from pathlib import Path

import emucore
from emucore import EmulatorError

CLUSTER = "emu-lsf"
WITH_ARG = {
    "-J", "-o", "-oo", "-e", "-eo", "-q", "-n", "-W", "-M", "-R", "-P", "-cwd", "-env", "-G",
    "-m", "-app", "-u", "-L", "-sp", "-g", "-b", "-t", "-E", "-Ep", "-We", "-c", "-v", "-sla",
    "-Lp", "-C", "-D", "-F", "-S", "-k", "-a", "-i", "-is", "-w",
}
FLAGS = {"-x", "-B", "-N", "-H", "-r", "-rn", "-Zs", "-K", "-I", "-Ip", "-Is", "-h", "-V"}
UNSUPPORTED = {"-K": "-K (wait for the job)", "-I": "interactive jobs", "-Ip": "interactive jobs",
               "-Is": "interactive jobs", "-w": "job dependencies (-w)",
               "-i": "input files (-i)", "-is": "input files (-is)", "-E": "pre-exec (-E)",
               "-Ep": "post-exec (-Ep)"}
UNITS = {"K": 1, "KB": 1, "M": 1 << 10, "MB": 1 << 10, "G": 1 << 20, "GB": 1 << 20,
         "T": 1 << 30, "TB": 1 << 30, "P": 1 << 40, "PB": 1 << 40}


def not_submitted(message: str) -> EmulatorError:
    return EmulatorError(f"{message}. Job not submitted.", 255)


def lsf_conf() -> dict[str, str]:
    """Parameters of ``$LSF_ENVDIR/lsf.conf`` (empty when unset or missing)."""
    envdir = os.environ.get("LSF_ENVDIR")
    conf: dict[str, str] = {}
    if not envdir:
        return conf
    try:
        text = (Path(envdir) / "lsf.conf").read_text()
    except OSError:
        return conf
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            conf[name.strip()] = value.strip().strip("\"'")
    return conf


def setting(name: str, default: str) -> str:
    return os.environ.get(name) or lsf_conf().get(name) or default


def queues() -> list[str]:
    names = [q.strip() for q in os.environ.get("HPCSCHED_EMU_QUEUES", "normal").split(",")]
    return [q for q in names if q] or ["normal"]


def limit_kb(value: str, what: str) -> int:
    """A memory limit in KB; bare numbers are in ``LSF_UNIT_FOR_LIMITS``."""
    m = re.match(r"^(\d+(?:\.\d+)?)\s*([A-Za-z]*)$", value.strip())
    unit = (m.group(2).upper() if m else "") or setting("LSF_UNIT_FOR_LIMITS", "KB").upper()
    if not m or unit not in UNITS:
        raise not_submitted(f"{value}: Bad {what} value")
    return int(float(m.group(1)) * UNITS[unit])


def run_limit(value: str) -> int:
    m = re.match(r"^(?:(\d+):)?(\d+)(?:/\S+)?$", value)
    if not m:
        raise not_submitted(f"{value}: Bad RUNLIMIT specification")
    return (int(m.group(1) or 0) * 60 + int(m.group(2))) * 60


def parse_argv(argv: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """bsub's options up to the command; values may be attached (``-n4``)."""
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return opts, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return opts, argv[i:]
        if word in FLAGS:
            opts.append((word, ""))
        elif word in WITH_ARG:
            if i + 1 >= len(argv):
                raise EmulatorError(f"bsub: option requires an argument -- {word[1:]}\n{USAGE}", 255)
            opts.append((word, argv[i + 1]))
            i += 1
        elif word[:2] in WITH_ARG and len(word) > 2:
            opts.append((word[:2], word[2:]))
        else:
            raise EmulatorError(f"bsub: illegal option -- {word[1:]}\n{USAGE}", 255)
        i += 1
    return opts, []


USAGE = ("Usage: bsub [-h] [-V] [-H] [-x] [-r] [-N] [-B] [-J job_name] [-q queue_name] "
         "[-n num_tasks] [-W [hour:]minute] [-M mem_limit] [-R res_req] [-P project_name] "
         "[-o out_file] [-e err_file] [-cwd dir] [-env env_list] [command [argument ...]]")


def read_directives(script: str) -> list[tuple[str, str]]:
    opts: list[tuple[str, str]] = []
    for line in script.splitlines():
        stripped = line.strip()
        if stripped.startswith("#BSUB") and (len(stripped) == 5 or stripped[5].isspace()):
            try:
                found, rest = parse_argv(shlex.split(stripped[5:], comments=True))
            except ValueError as exc:
                raise not_submitted(f"#BSUB line error: {exc}") from None
            if rest:
                raise not_submitted(f"Bad #BSUB line: {stripped}")
            opts += found
        elif stripped and not stripped.startswith("#"):
            break
    return opts


def parse_job_name(value: str) -> tuple[str, list[int] | None, int | None]:
    m = re.match(r"^([^\[\]]*)\[([0-9,:\-]+)\](?:%(\d+))?$", value)
    if "[" not in value:
        return value, None, None
    if not m:
        raise not_submitted("Bad job name")
    indices: list[int] = []
    for part in m.group(2).split(","):
        r = re.match(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$", part)
        if not r or int(r.group(1)) < 1:
            raise not_submitted("Bad job name")
        start = int(r.group(1))
        end = int(r.group(2) or start)
        step = int(r.group(3) or 1)
        if end < start or step < 1:
            raise not_submitted("Bad job name")
        indices += range(start, end + 1, step)
    limit = int(m.group(3)) if m.group(3) else None
    return m.group(1), sorted(set(indices)), limit


def job_env(env_opt: str | None) -> dict[str, str]:
    """The job's environment as ``-env`` selects it (default: all of the submitter's)."""
    if env_opt is None:
        return dict(os.environ)
    items = [i.strip() for i in env_opt.split(",") if i.strip()]
    if items and items[0] == "none":
        return {}
    env = dict(os.environ) if items and items[0] == "all" else {}
    for item in items:
        if item in ("all", "none"):
            continue
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def output_path(value: str, cwd: str, seq: int, index: int | None, ext: str) -> str:
    value = value.replace("%J", str(seq)).replace("%I", str(index or 0))
    path = Path(value) if os.path.isabs(value) else Path(cwd) / value
    if path.is_dir() or value.endswith("/"):
        path = path / f"{seq}.{ext}"
    return str(path)


def bsub(argv: list[str], stdin_text: str | None) -> str:
    root = emucore.state_dir("bsub")
    store = emucore.Store(root)
    cli, command = parse_argv(argv)
    for opt, _ in cli:
        if opt in UNSUPPORTED:
            raise EmulatorError(f"bsub: {UNSUPPORTED[opt]} is not supported by the emulator", 255)
        if opt in ("-h", "-V"):
            raise EmulatorError(USAGE if opt == "-h" else "IBM Spectrum LSF 10.1.0.13 (emulator)", 0)
    script = None
    if not command:
        script = stdin_text or ""
        directives = read_directives(script)
    elif setting("LSB_BSUB_PARSE_SCRIPT", "N").upper() == "Y" and Path(command[0]).is_file():
        directives = read_directives(Path(command[0]).read_text(errors="replace"))
    else:
        directives = []
    opts: dict[str, str] = {}
    for opt, val in directives + cli:
        opts[opt] = val
    for opt in [o for o, _ in directives + cli if o in UNSUPPORTED]:
        raise EmulatorError(f"bsub: {UNSUPPORTED[opt]} is not supported by the emulator", 255)
    if script is not None:
        command_text = ";".join(line.strip() for line in script.splitlines() if line.strip())
    else:
        command_text = " ".join(command)
    if not command_text:
        raise not_submitted("No command is specified")
    wanted = opts.get("-q", "").split()
    queue = next((q for q in wanted if q in queues()), None) if wanted else queues()[0]
    if queue is None:
        raise EmulatorError(f"{wanted[0]}: No such queue. Job not submitted.", 255)
    # only -J declares arrays; a default name (the command) may contain brackets
    name, indices, array_limit = (parse_job_name(opts["-J"]) if "-J" in opts
                                  else (command_text, None, None))
    slots_spec = opts.get("-n", "1").split(",")[0]
    if not slots_spec.isdigit() or int(slots_spec) < 1:
        raise not_submitted(f"{opts.get('-n')}: Bad argument for option -n")
    slots = int(slots_spec)
    walltime = run_limit(opts["-W"]) if "-W" in opts else None
    memlimit = limit_kb(opts["-M"], "MEMLIMIT") if "-M" in opts else None
    res_req = opts.get("-R", "")
    if res_req.count("[") != res_req.count("]"):
        raise not_submitted("Bad resource requirement syntax")
    rusage = re.search(r"rusage\[[^\]]*mem=([0-9.]+[A-Za-z]*)", res_req)
    rusage_mem = limit_kb(rusage.group(1), "rusage") if rusage else None
    max_running = emucore.submit_env_settings(store)
    submit_cwd = os.getcwd()
    with store.locked():
        seq = store.next_seq()
    cwd = opts.get("-cwd", submit_cwd).replace("%J", str(seq))
    cwd = cwd if os.path.isabs(cwd) else os.path.join(submit_cwd, cwd)
    if script is not None:
        path = root / "scripts" / f"{seq}.lsf"
        path.parent.mkdir(exist_ok=True)
        path.write_text(script)
        path.chmod(stat.S_IRWXU)
        argv_run = [str(path)] if script.startswith("#!") else ["/bin/sh", str(path)]
    else:
        argv_run = ["/bin/sh", "-c", command_text]
    common = {
        "name": name, "queue": queue, "max_running": max_running, "user_hold": "-H" in opts,
        "array_limit": array_limit, "workdir": submit_cwd,
        "lsf": {"command": command_text, "project": opts.get("-P", "default"), "slots": slots,
                "memlimit_kb": memlimit, "rusage_mem_kb": rusage_mem, "res_req": res_req,
                "user": emucore.username(), "from_host": emucore.hostname(),
                "unit": setting("LSF_UNIT_FOR_LIMITS", "KB").upper(),
                "array_spec": opts.get("-J") if indices else None},
    }
    recs = []
    if indices is not None:
        recs.append(emucore.new_record("lsf", seq, None, array=True, indices=indices, **common))
    for index in indices or [None]:
        recs.append(_element(root, seq, index, indices, opts, common, cwd, argv_run, walltime))
    with store.locked():
        for rec in recs:
            store.save(rec)
    for rec in recs:
        if not rec["array"]:
            emucore.spawn_supervisor(store, rec["key"])
    where = f"queue <{queue}>" if "-q" in opts else f"default queue <{queue}>"
    return f"Job <{seq}> is submitted to {where}."


def _element(root: Path, seq: int, index: int | None, indices: list[int] | None, opts: dict,
             common: dict, cwd: str, argv_run: list[str], walltime: int | None) -> dict:
    host = emucore.hostname()
    slots = common["lsf"]["slots"]
    name = common["name"] if index is None else f"{common['name']}[{index}]"
    env = job_env(opts.get("-env"))
    hostfile = root / "aux" / (str(seq) if index is None else f"{seq}.{index}")
    env.update({
        "LSB_JOBID": str(seq), "LSB_JOBNAME": name, "LSB_JOBINDEX": str(index or 0),
        "LSB_BATCH_JID": str(seq) if index is None else f"{seq}[{index}]",
        "LSB_QUEUE": common["queue"], "LSB_HOSTS": " ".join([host] * slots),
        "LSB_MCPU_HOSTS": f"{host} {slots}", "LSB_DJOB_NUMPROC": str(slots),
        "LSB_DJOB_HOSTFILE": str(hostfile), "LSB_JOBFILENAME": argv_run[-1],
        "LS_SUBCWD": common["workdir"], "LSB_SUB_HOST": host, "LSB_EXEC_CLUSTER": CLUSTER,
        "LSFUSER": common["lsf"]["user"], "LS_JOBPID": "0",
    })
    if indices is not None:
        env["LSB_JOBINDEX_END"] = str(max(indices))
        env["LSB_JOBINDEX_STEP"] = "1"
    out_opt = opts.get("-oo", opts.get("-o"))
    err_opt = opts.get("-eo", opts.get("-e"))
    mail = root / "mail" / (str(seq) if index is None else f"{seq}.{index}")
    stdout = output_path(out_opt, cwd, seq, index, "out") if out_opt else str(mail)
    stderr = output_path(err_opt, cwd, seq, index, "err") if err_opt else None
    if out_opt:
        env["LSB_OUTPUTFILE"] = stdout
    if stderr:
        env["LSB_ERRORFILE"] = stderr
    run = {
        "argv": argv_run, "cwd": cwd if os.path.isdir(cwd) else "/tmp", "env": env,
        "stdout": stdout, "stderr": stderr,
        "stdout_mode": "w" if "-oo" in opts or not out_opt else "a",
        "stderr_mode": "w" if "-eo" in opts else "a",
        "files": {str(hostfile): "".join(f"{host}\n" for _ in range(slots))},
        "cleanup": [str(hostfile)], "walltime": walltime, "epilogue": "lsf_status",
        "kill_signals": {"delete": ["SIGINT", "SIGTERM", "SIGKILL"],
                         "walltime": ["SIGUSR2", "SIGKILL"]},
    }
    rec = emucore.new_record("lsf", seq, index, run=run, **common)
    rec["lsf"] = dict(common["lsf"], job_name=name, stdout=stdout)
    return rec


def main() -> None:
    argv = sys.argv[1:]
    try:
        _, command = parse_argv(argv)
        stdin_text = sys.stdin.read() if not command and sys.stdin is not None else None
        out = bsub(argv, stdin_text)
    except EmulatorError as exc:
        print(exc.message, file=sys.stderr if exc.code else sys.stdout)
        sys.exit(exc.code)
    print(out)
