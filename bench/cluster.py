"""A throwaway PostgreSQL cluster for the benchmark modes that must not share a server.

The held-horizon trial and the long soak need autovacuum on and nothing else
running against the server, which the shared 127.0.0.1:5432 (autovacuum off,
other engineers' tests) cannot promise. ``initdb`` + ``pg_ctl`` of the newest
PostgreSQL on the machine, a free port on 127.0.0.1, the server's default
settings apart from where it listens, torn down by ``stop()``. PostgreSQL refuses
to run as root, so as root it runs as the OS user ``postgres``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def server_bindir() -> Path:
    """The newest server binaries (Debian layout first, then PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise SystemExit("bench: no PostgreSQL server binaries (initdb) on this machine")
    return Path(initdb).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Cluster:
    """``with Cluster() as c:`` — a running server on ``c.port``, gone afterwards."""

    def __init__(self, *, name: str = "bench", settings: dict[str, str] | None = None):
        self.bindir = server_bindir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"pgjobs-{name}-cluster-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        # Where it listens, and a name in its process titles (``ps`` tells its backends
        # from the shared server's): every other setting stays the server's default.
        self.title = f"postgres: pgjobs-{name}:"
        self.settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            "cluster_name": f"'pgjobs-{name}'",
            **(settings or {}),
        }

    def _run(self, *argv: str) -> None:
        subprocess.run(
            _as_server_user(list(argv)),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            timeout=120,
        )

    def start(self) -> Cluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust"
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            for key, value in self.settings.items():
                conf.write(f"{key} = {value}\n")
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start"
        )
        return self

    def dsn(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def save_log(self, dest: str) -> None:
        """Keep the server's log (it goes with the cluster's folder)."""
        if self.log.exists():
            shutil.copyfile(self.log, dest)

    def stop(self) -> None:
        pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.data)]
        if (self.data / "postmaster.pid").exists():  # also a start that failed half-way
            try:
                self._run(*pg_ctl, "-m", "fast", "stop")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self._run(*pg_ctl, "-m", "immediate", "stop")
        for _ in range(20):  # bounded: rmtree can race the server's last writes
            shutil.rmtree(self.root, ignore_errors=True)
            if not self.root.exists():
                break
            time.sleep(0.1)

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
