"""TLS: `PostgresStore.connect(ssl=SSLContext)` talks to a server that requires TLS."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from venturi import PostgresStore, Queue
from venturi.embedded import EmbeddedPostgres

from .helpers import all_migrations
from .test_cli import venturi


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[str, Path]]:
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make the test certificate"
    # Not pytest's tmp_path: its parent is private to root, and the server runs as another user.
    certs = Path(tempfile.mkdtemp(prefix="venturi-tls-"))
    cert, key = certs / "server.crt", certs / "server.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    os.chmod(certs, 0o755)
    os.chmod(cert, 0o644)
    os.chmod(key, 0o600)
    if os.geteuid() == 0:  # the server runs as an unprivileged user and must own its key
        import pwd

        user = pwd.getpwnam("postgres") if _has_user("postgres") else pwd.getpwnam("venturi-pg")
        os.chown(key, user.pw_uid, user.pw_gid)
    settings = {"ssl": "on", "ssl_cert_file": str(cert), "ssl_key_file": str(key)}
    try:
        with EmbeddedPostgres(settings=settings) as pg:
            yield pg.dsn, cert
    finally:
        shutil.rmtree(certs, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


async def test_connect_over_verified_tls(tls_server: tuple[str, Path]) -> None:
    dsn, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))  # verifies the chain and the IP
    async with await PostgresStore.connect(dsn, prefix="tls", ssl=context) as store:
        assert await store.migrate() == all_migrations()
        assert (await Queue(store).stats()).pending == 0
        pool = store._pool  # the test checks the session itself
        assert await pool.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")


async def test_untrusted_certificate_is_refused(tls_server: tuple[str, Path]) -> None:
    dsn, _ = tls_server
    context = ssl.create_default_context()  # system CAs only: our self-signed cert fails
    with pytest.raises(ssl.SSLCertVerificationError):
        await PostgresStore.connect(dsn, prefix="tls", ssl=context)


def test_a_worker_does_not_wait_for_a_certificate_that_does_not_verify(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    # An outage is waited for at start; a certificate no wait mends is not (else the worker
    # would wait forever, saying "unavailable").
    dsn, _ = tls_server
    unrelated = tmp_path / "other-ca.crt"  # a CA that did not sign the server's certificate
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-keyout", str(tmp_path / "other.key"), "-out", str(unrelated)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    run = venturi(
        "worker",
        "tests.runtime.cli_app:make_worker",
        dsn=f"{dsn}?sslmode=verify-full&sslrootcert={unrelated}",
    )
    assert run.returncode == 2, run.stderr
    assert "certificate verify failed" in run.stderr
    assert "waiting for it" not in run.stderr
