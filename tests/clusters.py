"""Private PostgreSQL clusters (and a PgBouncer) for the deployment tests.

Each cluster is initdb'd into a temporary directory, listens on a free loopback port and is
stopped and removed afterwards; the shared server is never touched. As root, the server and
PgBouncer run as the ``postgres`` user (neither runs as root). The programs are looked up in
the usual Debian places; in CI (``CI`` set) a missing one is an error, never a skip.
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
from typing import Optional

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        raise AssertionError(f"CI is set but {what} is not installed")
    pytest.skip(f"{what} is not installed")


def pg_bin() -> Path:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    _missing("the PostgreSQL server programs (initdb, pg_ctl)")
    raise AssertionError("unreachable")


def _as_root() -> bool:
    return os.geteuid() == 0


def _run(cmd: list[str], **kw: object) -> str:
    user = "postgres" if _as_root() else None
    out = subprocess.run(cmd, capture_output=True, text=True, user=user, **kw)  # type: ignore[call-overload]
    if out.returncode != 0:
        raise AssertionError(f"{cmd[0]} failed: {out.stdout}\n{out.stderr}")
    return str(out.stdout)


def _own(path: Path) -> None:
    if _as_root():
        shutil.chown(path, "postgres")


class Cluster:
    """``initdb`` + ``pg_ctl start`` on a free port; ``conf`` lines go to postgresql.conf and
    ``hba`` replaces pg_hba.conf (local socket connections stay trusted for set-up)."""

    def __init__(self, conf: str = "", hba: str = "host all all 127.0.0.1/32 trust\n") -> None:
        self.bin = pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="awa-deploy-"))
        self.dir.chmod(0o755)
        _own(self.dir)
        self.data = self.dir / "data"
        self.port = free_port()
        _run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n")
            f.write(f"unix_socket_directories = '{self.dir}'\nfsync = off\nmax_connections = 60\n")
            f.write(conf)
        (self.data / "pg_hba.conf").write_text("local all all trust\n" + hba)
        self._started = False
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.dir / "log"), "start"])
        self._started = True

    def psql(self, sql: str, db: str = "postgres") -> str:
        """Run SQL over the local socket as the superuser (set-up, not the code under test)."""
        return _run(["psql", "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d", db,
                     "-Atqc", sql])

    def stop(self) -> None:
        if self._started:
            subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                           capture_output=True, user="postgres" if _as_root() else None)
            self._started = False
        shutil.rmtree(self.dir, ignore_errors=True)


class Certificates:
    """A CA, a server certificate for localhost / 127.0.0.1, a client certificate for
    ``client_user``, and an unrelated second CA, all made with ``openssl`` in ``directory``."""

    def __init__(self, directory: Path, client_user: str) -> None:
        if shutil.which("openssl") is None:
            _missing("openssl")
        self.dir = directory
        self.ca = self._ca("ca")
        self.wrong_ca = self._ca("wrong-ca")
        self.server_cert, self.server_key = self._leaf(
            "server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        self.client_cert, self.client_key = self._leaf(
            "client", client_user, "extendedKeyUsage=clientAuth\n")

    def _openssl(self, *args: str) -> None:
        out = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=self.dir)
        if out.returncode != 0:
            raise AssertionError(f"openssl {args[0]} failed: {out.stderr}")

    def _ca(self, name: str) -> Path:
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                      "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=awa test {name}",
                      "-addext", "basicConstraints=critical,CA:TRUE",
                      "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return self.dir / f"{name}.crt"

    def _leaf(self, name: str, cn: str, ext: str) -> tuple[Path, Path]:
        (self.dir / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n" + ext)
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                      "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                      "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
        key = self.dir / f"{name}.key"
        key.chmod(0o600)
        return self.dir / f"{name}.crt", key


class Bouncer:
    """Debian's ``pgbouncer`` in front of ``cluster`` on a free loopback port, in transaction
    pooling mode with a small server pool (so that clients really share server sessions)."""

    def __init__(self, cluster: Cluster, pool_size: int = 4, users: tuple[str, ...] = ("postgres",)) -> None:
        exe = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
        if exe is None:
            _missing("pgbouncer")
        assert exe is not None
        self.port = free_port()
        self.dir = cluster.dir / "pgbouncer"
        self.dir.mkdir()
        _own(self.dir)
        # auth_type = trust still wants every user listed.
        (self.dir / "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in users))
        ini = self.dir / "pgbouncer.ini"
        # The configuration docs/deploying.md shows, with test paths and ports.
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={cluster.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        for p in (ini, self.dir / "userlist.txt"):
            _own(p)
        self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
            [exe, str(ini)], user="postgres" if _as_root() else None,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Ready once it accepts connections (bounded).
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("pgbouncer did not start: " + self.log()) from e
                time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text()
        except OSError:
            return "(no log)"

    def url(self, db: str, params: str = "pool_mode=transaction", user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}?{params}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None
