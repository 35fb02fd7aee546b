"""A real one-node Slurm cluster for the tests: Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them),
started as root with a ``slurm.conf`` in a temporary directory.

    from slurm_cluster import slurm_cluster   # a module-scoped fixture; tests/test_slurm.py

munged, slurmctld and slurmd run in the foreground as children of the test process, on free ports, with their
state, spool, logs and munge key in the temporary directory (nothing of the machine's /etc is used); the node has 2
CPUs (``proctrack/linuxproc``, ``task/none``, ``select/cons_tres``: no cgroups). ``SLURM_CONF`` points the clients
(sbatch, squeue, scancel, scontrol) and the jobs at it. Skipped with one line where it cannot start: not root, or a
binary missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
NODE_CPUS = 2
START_TIMEOUT_S = 60


@dataclass
class SlurmCluster:
    """The running cluster: its directory, its config file and the environment its clients need."""

    root: Path
    conf: Path
    node: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True) -> str:
        out = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=60)
        if check and out.returncode:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}\n{self.logs()}")
        return out.stdout

    def jobs(self) -> list[str]:
        """The job ids (``123_4`` for an array task) that are pending or running."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def wait_idle(self, timeout_s: float) -> None:
        """Until no job is queued or running (AssertionError with the daemons' logs after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.jobs():
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still queued after {timeout_s} s: {self.jobs()}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"== {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                         for p in sorted((self.root / "log").glob("*.log")))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def why_not() -> str | None:
    """Why a cluster cannot start here (one line), or None."""
    if os.geteuid() != 0:
        return "the Slurm tests start munged, slurmctld and slurmd as root; not root here"
    missing = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
    return None


def write_config(root: Path, node: str, ports: list[int]) -> Path:
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=tests",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.sock'}",
        "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "KillWait=5",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        ""]))
    return conf


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A started one-node cluster (:class:`SlurmCluster`); its daemons are stopped afterwards, its jobs cancelled."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    node = socket.gethostname().split(".")[0]
    conf = write_config(root, node, _free_ports(2))
    cluster = SlurmCluster(root, conf, node)
    munge = root / "munge"
    commands = [
        ["munged", "--foreground", "--force", f"--key-file={munge / 'munge.key'}", f"--socket={munge / 'munge.sock'}",
         f"--pid-file={munge / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
         f"--seed-file={munge / 'munged.seed'}"],
        ["slurmctld", "-D", "-f", str(conf)],
        ["slurmd", "-D", "-f", str(conf), "-N", node],
    ]
    daemons: list[subprocess.Popen] = []
    try:
        for cmd in commands:
            daemons.append(subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True))
            if cmd[0] == "munged":
                _wait_for(lambda: (munge / "munge.sock").exists(), "munged's socket", cluster)
        _wait_for(lambda: cluster.run("sinfo", "-h", "-o", "%t", check=False).strip() == "idle", "an idle node",
                  cluster)
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(conf)  # the code under test calls sbatch as a user would
        try:
            yield cluster
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            cluster.run("scancel", "--user=root", check=False)
            with_deadline = time.monotonic() + 30
            while cluster.jobs() and time.monotonic() < with_deadline:
                time.sleep(0.5)
    finally:
        for proc in reversed(daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_for(condition, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the test cluster has no {what} after {START_TIMEOUT_S} s\n{cluster.logs()}")
        time.sleep(0.3)
