"""A real one-node Slurm cluster on loopback for the tests: munged, slurmctld and slurmd of
Debian's slurm-wlm, every file in a temporary folder, a private munge socket.

The node is named like the agent it stands beside (`node-01`) and declares eight GPUs whose
device files are links to /dev/null (slurmd drops GPUs without `File=`). `.ci/run` installs
slurm-wlm and sets FLEXGATE_REQUIRE_SLURM=1, which turns the skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REQUIRED = os.environ.get("FLEXGATE_REQUIRE_SLURM") == "1"
DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "node-01"


def require_slurm() -> None:
    """Skip (fail in CI) unless Slurm's daemons and commands are installed."""
    missing = [c for c in (*DAEMONS, "sbatch", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        reason = f"slurm-wlm and munge are not installed ({', '.join(missing)} missing)"
        if REQUIRED:
            pytest.fail(f"FLEXGATE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(f"{reason}: apt-get install slurm-wlm munge (CI runs these)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlurmCluster:
    """Started by `start()`, stopped (jobs cancelled first) by `stop()`."""

    def __init__(self, root: Path, *, prolog: Path | None = None) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.prolog = prolog
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen[bytes]] = []

    def _write_config(self) -> None:
        root = self.root
        for name in ("state", "spool", "log", "munge", "dev"):
            (root / name).mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        (root / "munge").chmod(0o755)  # every folder above the socket searchable by all
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(8):
            link = root / "dev" / f"gpu{i}"
            if not link.exists():
                link.symlink_to("/dev/null")
        cpus = 8  # declared, not counted: config_overrides lets slurmd accept it
        hooks = ""
        if self.prolog is not None:
            hooks = f"PrologSlurmctld={self.prolog}\nEpilogSlurmctld={self.prolog}\n"
        node = (
            f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname=localhost CPUs={cpus} "
            "RealMemory=1000 Gres=gpu:8 State=UNKNOWN"
        )
        self.conf.write_text(
            f"""ClusterName=flexgate-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=2
{hooks}{node}
PartitionName=gpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (root / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={root}/dev/gpu[0-7]\n")

    def start(self, timeout_s: float = 30.0) -> None:
        self._write_config()
        root = self.root
        self._spawn(
            "munged",
            "-F",
            "-S",
            f"{root}/munge/munge.socket",
            f"--key-file={root}/munge/munge.key",
            f"--pid-file={root}/munge/munged.pid",
            f"--seed-file={root}/munge/munge.seed",
            f"--log-file={root}/log/munged.log",
        )
        self._wait(lambda: (root / "munge" / "munge.socket").exists(), "munged", timeout_s)
        self._controller = self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-N", NODE, "-f", str(self.conf))
        self._wait(self._idle, f"node {NODE} idle in sinfo", timeout_s)

    def stop_controller(self) -> None:
        """slurmctld gone (its state saved): every Slurm command fails or waits."""
        self._controller.terminate()
        self._controller.wait(timeout=20)
        self._daemons.remove(self._controller)

    def start_controller(self, timeout_s: float = 30.0) -> None:
        """slurmctld back, with the jobs it saved."""
        self._controller = self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._wait(
            lambda: self.command("squeue", "-h", check=False).returncode == 0,
            "slurmctld answering",
            timeout_s,
        )

    def _idle(self) -> bool:
        answer = self.command("sinfo", "-h", "-N", "-o", "%T", check=False)
        return answer.returncode == 0 and answer.stdout.strip() == "idle"

    def _spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        with open(self.root / "log" / f"{argv[0]}.out", "ab") as log:
            daemon = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self._daemons.append(daemon)
        return daemon

    def _wait(self, check, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            for daemon in self._daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{daemon.args[0]} exited: {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout_s} s: {self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        tails = []
        for path in sorted((self.root / "log").glob("*")):
            tails.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(tails)

    def command(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=20, check=check
        )

    def sbatch(self, *options: str, seconds: int = 600) -> str:
        """Submit `sleep seconds` with these options; the job id."""
        answer = self.command(
            "sbatch",
            "--parsable",
            f"--chdir={self.root}",
            f"--output={self.root}/log/job-%j.out",
            *options,
            "--wrap",
            f"sleep {seconds}",
        )
        return answer.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        answer = self.command("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return answer.stdout.strip()

    def cancel_all(self) -> None:
        self.command("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not self.command("squeue", "-h", check=False).stdout.strip():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        try:
            self.cancel_all()  # job steps run under slurmstepd: gone before slurmd is
        finally:
            for daemon in reversed(self._daemons):
                daemon.terminate()
            for daemon in reversed(self._daemons):
                try:
                    daemon.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
