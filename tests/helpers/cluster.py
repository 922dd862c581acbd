"""Throwaway PostgreSQL clusters for tests that must restart a server, preload
pg_cron or sit behind pgbouncer. Built from the machine's own PostgreSQL binaries
(``initdb``/``pg_ctl``), on a free port, run as a non-root user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def pg_bindir() -> Path | None:
    """The newest PostgreSQL server binaries on this machine (Debian layout or PATH)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
    )
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run as ``postgres`` when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class TempCluster:
    """``initdb`` + ``pg_ctl`` on a free port; ``url(db)`` gives a Django DATABASE_URL."""

    def __init__(
        self,
        *,
        conf: dict[str, str] | None = None,
        name: str = "pgjobs",
        standby_of: TempCluster | None = None,
    ):
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix=f"{name}-cluster-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.conf = conf or {}
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        if standby_of is not None:
            # A streaming standby: a base backup of the running primary, with
            # standby.signal and primary_conninfo written by -R.
            subprocess.run(
                _as_user(
                    [
                        str(bindir / "pg_basebackup"),
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(standby_of.port),
                        "-U",
                        "postgres",
                        "-D",
                        str(self.data),
                        "-R",
                        "-X",
                        "stream",
                        "-c",
                        "fast",
                    ]
                ),
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            self._configure()
            return
        subprocess.run(
            _as_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._configure()

    def _configure(self) -> None:
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "off",
            "log_min_messages": "warning",
            **self.conf,
        }
        with open(self.data / "postgresql.conf", "a") as fh:
            for key, value in settings.items():
                fh.write(f"{key} = {value}\n")

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            _as_user(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    *args,
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )

    def start(self) -> TempCluster:
        self.pg_ctl("start")
        return self

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "stop")

    def restart(self) -> None:
        self.pg_ctl("-m", "fast", "restart")

    def stop_immediate(self) -> None:
        """A crash as far as clients can tell: no shutdown checkpoint, connections cut."""
        self.pg_ctl("-m", "immediate", "stop")

    def promote(self) -> None:
        """Turn this standby into a primary (waits until it accepts writes)."""
        self.pg_ctl("promote")

    def standby(self, *, name: str = "standby", conf: dict[str, str] | None = None) -> TempCluster:
        """A streaming standby of this (running) cluster, made with pg_basebackup; not started.

        ``cluster_name`` is the standby's application name on the primary, so
        ``synchronous_standby_names`` can name it.
        """
        return TempCluster(
            name=name,
            standby_of=self,
            conf={**self.conf, "cluster_name": f"'{name}'", **(conf or {})},
        )

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, dbname: str) -> None:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def server_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
            pass
        shutil.rmtree(self.root, ignore_errors=True)
