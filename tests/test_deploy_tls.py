"""TLS and connection failures (issue 14, items 1 and 2; issue 13, item 10).

A private cluster with ``ssl = on`` and a TLS-only ``pg_hba.conf`` (``hostssl`` lines only),
certificates made here with ``openssl``: ``require``, ``verify-ca`` and ``verify-full`` work
with the right CA, ``verify-full`` with a wrong CA fails saying the certificate did not
verify, plain text is refused, client certificates authenticate (``cert`` in pg_hba), and the
``PG*`` environment variables work like the URL's parameters. Since every non-TLS connection
is refused, a worker that runs jobs there proves that the pool, the listener, the leader's
connection and migrations all connect with TLS.

Connection failures name the address and the cause within the connect timeout and never print
the URL's password; the constructors fail fast (awa-pg 0.6.9's do too).
"""

from __future__ import annotations

import dataclasses
import socket
import time
import uuid
from typing import Iterator

import pytest

import awa
from clusters import Certificates, Cluster, _own, free_port
from helpers import FAST, wait_for, wait_for_state

PASSWORD = "s3cret-Pw-never-printed"


@dataclasses.dataclass
class Ping:
    n: int


@dataclasses.dataclass
class TlsCluster:
    cluster: Cluster
    certs: Certificates

    def url(self, db: str = "postgres", user: str = "postgres", params: str = "", host: str = "127.0.0.1") -> str:
        return f"postgres://{user}@{host}:{self.cluster.port}/{db}" + (f"?{params}" if params else "")

    def new_database(self) -> str:
        name = f"tls_{uuid.uuid4().hex[:10]}"
        self.cluster.psql(f'CREATE DATABASE "{name}"')
        return name


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsCluster]:
    cluster = Cluster()
    try:
        certs_dir = cluster.dir / "certs"
        certs_dir.mkdir()
        certs = Certificates(certs_dir, client_user="cert_user")
        for p in [certs_dir, *certs_dir.iterdir()]:
            _own(p)
        with open(cluster.data / "postgresql.conf", "a") as f:
            f.write(f"ssl = on\nssl_cert_file = '{certs.server_cert}'\nssl_key_file = '{certs.server_key}'\n"
                    f"ssl_ca_file = '{certs.ca}'\n")
        # TLS only: no `host` line, so a plain-text connection matches nothing and is refused.
        (cluster.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all cert_user 127.0.0.1/32 cert\n"
            "hostssl all pw_user 127.0.0.1/32 scram-sha-256\n"
            "hostssl all all 127.0.0.1/32 trust\n"
        )
        cluster.psql("SELECT pg_reload_conf()")
        cluster.psql("CREATE ROLE cert_user LOGIN SUPERUSER")
        cluster.psql(f"SET password_encryption = 'scram-sha-256'; CREATE ROLE pw_user LOGIN PASSWORD '{PASSWORD}'")
        assert cluster.psql("SHOW ssl").strip() == "on"
        yield TlsCluster(cluster, certs)
    finally:
        cluster.stop()


def assert_connect_error(exc: BaseException, address: str, *phrases: str) -> None:
    text = str(exc)
    assert isinstance(exc, awa.DatabaseError), (type(exc), text)
    assert f"could not connect to the database at {address}" in text, text
    for p in phrases:
        assert p in text, text
    assert PASSWORD not in text and PASSWORD not in repr(exc.args), text


# ----- TLS ---------------------------------------------------------------------------------

async def test_a_worker_runs_jobs_over_tls_only(tls: TlsCluster) -> None:
    """Pool, listener, leader and migrate() over verify-full (the server refuses plain text)."""
    db = tls.new_database()
    url = tls.url(db, params=f"sslmode=verify-full&sslrootcert={tls.certs.ca}")
    client = awa.AsyncClient(url)
    try:
        await client.migrate()
        done: list[int] = []

        @client.task(Ping)
        async def ping(job: awa.Job) -> None:
            done.append(job.args.n)

        jobs = [await client.insert(Ping(n=i)) for i in range(5)]
        await client.start([("default", 2)], **FAST)
        try:
            for j in jobs:
                await wait_for_state(client, j.id, "completed")
            # Every connection of this database is encrypted, the listener and the leader
            # included (the leader is the one holding an advisory lock).
            rows = tls.cluster.psql(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) "
                f"FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.datname = '{db}'")
            encrypted, plain = (int(x) for x in rows.strip().split("|"))
            assert encrypted >= 2 and plain == 0, rows
            await wait_for(lambda: tls.cluster.psql(
                f"SELECT count(*) FROM pg_locks l JOIN pg_stat_ssl s USING (pid) "
                f"WHERE l.locktype = 'advisory' AND s.ssl AND l.database = "
                f"(SELECT oid FROM pg_database WHERE datname = '{db}')").strip() == "1",
                what="the leader's lock on a TLS connection")
        finally:
            await client.shutdown()
    finally:
        await client.close()


@pytest.mark.parametrize("params", [
    "sslmode=require",
    "sslmode=verify-ca&sslrootcert={ca}",
    "sslmode=verify-full&sslrootcert={ca}",
])
def test_require_verify_ca_and_verify_full_connect(tls: TlsCluster, params: str) -> None:
    url = tls.url(params=params.format(ca=tls.certs.ca))
    with awa.Client(url) as c:
        assert c._run(c._async._execute("SELECT 1")) == 1


def test_verify_full_by_host_name(tls: TlsCluster) -> None:
    url = tls.url(host="localhost", params=f"sslmode=verify-full&sslrootcert={tls.certs.ca}")
    with awa.Client(url) as c:
        assert c._run(c._async._execute("SELECT 1")) == 1


@pytest.mark.parametrize("mode", ["verify-full", "verify-ca"])
def test_a_wrong_ca_fails_saying_the_certificate_did_not_verify(tls: TlsCluster, mode: str) -> None:
    url = tls.url(params=f"sslmode={mode}&sslrootcert={tls.certs.wrong_ca}")
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(url)
    assert_connect_error(e.value, f"127.0.0.1:{tls.cluster.port}", "certificate verify failed")


def test_plain_text_is_refused_clearly(tls: TlsCluster) -> None:
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(tls.url(params="sslmode=disable"))
    assert_connect_error(e.value, f"127.0.0.1:{tls.cluster.port}", "no pg_hba.conf entry", "no encryption",
                         "SQLSTATE 28000")
    assert e.value.sqlstate == "28000"


def test_a_client_certificate_authenticates(tls: TlsCluster) -> None:
    c = tls.certs
    url = tls.url(user="cert_user",
                  params=f"sslmode=verify-full&sslrootcert={c.ca}&sslcert={c.client_cert}&sslkey={c.client_key}")
    with awa.Client(url) as client:
        assert client._run(client._async._execute("SELECT 1")) == 1
    # Without the certificate the `cert` line refuses the role.
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(tls.url(user="cert_user", params=f"sslmode=verify-full&sslrootcert={c.ca}"))
    assert_connect_error(e.value, f"127.0.0.1:{tls.cluster.port}", "requires a valid client certificate")


def test_the_pg_environment_variables_configure_tls(tls: TlsCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    c = tls.certs
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    monkeypatch.setenv("PGSSLROOTCERT", str(c.ca))
    monkeypatch.setenv("PGSSLCERT", str(c.client_cert))
    monkeypatch.setenv("PGSSLKEY", str(c.client_key))
    with awa.Client(tls.url(user="cert_user")) as client:
        assert client._run(client._async._execute("SELECT 1")) == 1
    monkeypatch.setenv("PGSSLROOTCERT", str(c.wrong_ca))
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(tls.url(user="cert_user"))
    assert_connect_error(e.value, f"127.0.0.1:{tls.cluster.port}", "certificate verify failed")
    # The URL's parameter wins over the environment.
    with awa.Client(tls.url(params=f"sslrootcert={c.ca}")) as client:
        assert client._run(client._async._execute("SELECT 1")) == 1


def test_a_wrong_password_names_the_cause_and_never_the_password(tls: TlsCluster) -> None:
    port = tls.cluster.port
    with awa.Client(f"postgres://pw_user:{PASSWORD}@127.0.0.1:{port}/postgres?sslmode=require") as c:
        assert c._run(c._async._execute("SELECT 1")) == 1
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(f"postgres://pw_user:{PASSWORD}x@127.0.0.1:{port}/postgres?sslmode=require")
    assert_connect_error(e.value, f"127.0.0.1:{port}", 'password authentication failed for user "pw_user"',
                         "SQLSTATE 28P01")
    assert f"{PASSWORD}x" not in str(e.value)


# ----- connection failures -----------------------------------------------------------------

def test_connection_refused_fails_fast_with_the_address() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(f"postgres://app:{PASSWORD}@127.0.0.1:{port}/app")
    assert time.monotonic() - started < 5
    assert_connect_error(e.value, f"127.0.0.1:{port}", "connection refused")


async def test_the_async_constructor_fails_fast_too() -> None:
    port = free_port()
    with pytest.raises(awa.DatabaseError) as e:
        awa.AsyncClient(f"postgres://app:{PASSWORD}@127.0.0.1:{port}/app")
    assert_connect_error(e.value, f"127.0.0.1:{port}", "connection refused")


def test_no_such_host() -> None:
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(f"postgres://app:{PASSWORD}@no-such-host.invalid:5432/app")
    assert_connect_error(e.value, "no-such-host.invalid:5432", "no such host")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (the kernel completes the
    handshake; nobody reads): a server that hangs."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@pytest.mark.parametrize("params, limit", [("connect_timeout=1", 1.0), ("", 5.0)])
def test_a_server_that_does_not_answer_fails_within_the_timeout(
        silent_server: int, params: str, limit: float) -> None:
    url = f"postgres://app:{PASSWORD}@127.0.0.1:{silent_server}/app" + (f"?{params}" if params else "")
    started = time.monotonic()
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(url)
    took = time.monotonic() - started
    assert limit <= took < limit + 3, took
    assert_connect_error(e.value, f"127.0.0.1:{silent_server}", f"timed out after {limit:g} s")


def test_the_timeout_can_come_from_pgconnect_timeout(silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "1")
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(f"postgres://app@127.0.0.1:{silent_server}/app")
    assert "timed out after 1 s" in str(e.value)


@pytest.mark.parametrize("url", [
    f"postgres://app:{PASSWORD}@127.0.0.1:notaport/app",
    f"postgres://app:{PASSWORD}@127.0.0.1/app?connect_timeout=soon",
    f"postgres://app:{PASSWORD}@127.0.0.1/app?pool_mode=statement",
    f"postgres://app:{PASSWORD}@127.0.0.1/app?sslmode=sometimes",
])
def test_a_malformed_url_is_a_database_error_without_the_password(url: str) -> None:
    # awa-pg 0.6.9 raises DatabaseError for a malformed URL too.
    with pytest.raises(awa.DatabaseError) as e:
        awa.Client(url)
    assert str(e.value).startswith("invalid database URL") and PASSWORD not in str(e.value)
