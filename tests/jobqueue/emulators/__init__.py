"""Batch-system emulators for end-to-end tests of the batch-system adapters.

PBS, LSF, HTCondor, OAR, Moab and Flux cannot be installed here, so
``pbs/bin/{qsub,qstat,qdel}``, ``lsf/bin/{bsub,bjobs,bkill}``,
``htcondor/bin/{condor_submit,condor_q,condor_history,condor_rm}``,
``oar/bin/{oarsub,oarstat,oardel}``, ``moab/bin/{msub,showq,canceljob}`` and
``flux/bin/flux`` emulate them from their documentation: jobs really run as local
processes, and the commands print the real formats and errors (see the docstrings of
``pbs_submit``, ``pbs_status``, ``lsf_submit``, ``lsf_status``, ``htcondor_cli``,
``oar_cli``, ``moab_cli``, ``flux_cli``, ``emusys`` and ``emucore``).

Use from a test::

    from tests.jobqueue.emulators import cleanup, emulator_env

    @pytest.fixture
    def pbs_env(tmp_path):
        env = emulator_env("pbs", tmp_path / "pbs-state")
        yield env                      # pass env=... to subprocess, or monkeypatch os.environ
        cleanup(tmp_path / "pbs-state")

Environment variables the emulators read:

* ``HPCSCHED_EMU_STATE`` (required): the state directory (job records, scripts, mail).
* ``HPCSCHED_EMU_HOLD=1`` at submit time: creates ``<state>/hold``; every job stays
  pending (``Q``/``PEND``) until that file is removed (:func:`release`).
* ``HPCSCHED_EMU_MAX_RUNNING=N`` at submit time (or file ``<state>/max_running``): at most
  N jobs run at once, the others stay pending, first come first served.
* ``HPCSCHED_EMU_KILL_GRACE``: seconds between the polite signal and SIGKILL on
  qdel/bkill/walltime (default 1.0; :func:`emulator_env` sets 0.5).
* ``HPCSCHED_EMU_TIME_SCALE``: factor applied to walltimes when enforcing them (default
  1.0; ``1/60`` makes LSF's ``-W 1`` last one second).
* ``HPCSCHED_EMU_QUEUES=a,b``: the queues that exist (default ``workq`` for PBS,
  ``normal`` for LSF; the first is the default queue).
* ``HPCSCHED_EMU_PBS_SERVER``: PBS server name in job ids (default ``emu-pbs``).
* LSF only: ``LSF_ENVDIR`` (``lsf.conf``: ``LSF_UNIT_FOR_LIMITS``,
  ``LSB_BSUB_PARSE_SCRIPT``, ``LSB_BJOBS_CONSISTENT_EXIT_CODE``, ``LSB_BJOBS_FORMAT``).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import emucore

HERE = Path(__file__).resolve().parent
BIN = {system: HERE / system / "bin" for system in ("pbs", "lsf", "htcondor", "oar", "moab",
                                                   "flux")}
_SUBMIT_KNOBS = (emucore.HOLD_ENV, emucore.MAX_RUNNING_ENV)


def emulator_env(system: str, state_dir: str | os.PathLike) -> dict[str, str]:
    """Environment for running the ``system`` (``"pbs"`` or ``"lsf"``) commands.

    The emulator's ``bin`` directory comes first on ``PATH`` and ``HPCSCHED_EMU_STATE``
    names ``state_dir`` (created). Hold / max-running settings inherited from the calling
    environment are dropped, so each test opts in explicitly.
    """
    if system not in BIN:
        raise ValueError(f"unknown batch system {system!r}: expected one of {', '.join(BIN)}")
    root = Path(state_dir)
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _SUBMIT_KNOBS}
    env["PATH"] = f"{BIN[system]}{os.pathsep}{env.get('PATH', '')}"
    env[emucore.STATE_ENV] = str(root)
    env.setdefault(emucore.GRACE_ENV, "0.5")
    return env


def release(state_dir: str | os.PathLike) -> None:
    """Let held jobs start: remove the ``hold`` file."""
    (Path(state_dir) / "hold").unlink(missing_ok=True)


def live_processes(state_dir: str | os.PathLike) -> list[int]:
    """Pids of supervisors and job processes of ``state_dir`` that are still alive."""
    return emucore.live_processes(Path(state_dir))


def cleanup(state_dir: str | os.PathLike, timeout: float = 5.0) -> None:
    """Kill every job process and supervisor still alive; raise if any survives."""
    root = Path(state_dir)
    if not (root / "jobs").is_dir():
        return
    left = emucore.kill_everything(root, timeout)
    if left:
        raise RuntimeError(f"emulator processes still alive after cleanup: {left}")
