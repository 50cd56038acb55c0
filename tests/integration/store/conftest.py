"""A private PostgreSQL cluster for the store tests (initdb + pg_ctl on a free loopback port),
and a ``db_url`` fixture parametrized over SQLite and PostgreSQL."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import require


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(initdb)) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Start a throw-away cluster; yield its admin URL; stop and delete it afterwards."""
    bindir = _pg_bin()
    require(bindir is not None, "PostgreSQL server (Debian package postgresql: scripts/setup/test/30-postgres.sh)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        require(False, "psycopg (pip extra 'postgres')")
    base = tempfile.mkdtemp(prefix="execbox-pg-")
    data = os.path.join(base, "data")
    as_user: dict[str, str] = {}
    if os.geteuid() == 0:  # initdb refuses to run as root
        shutil.chown(base, "postgres", "postgres")
        as_user = {"user": "postgres", "group": "postgres"}
    port = _free_port()
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    subprocess.run([f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, env=env, cwd=base, **as_user)
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-o", options, "-l", os.path.join(base, "log"),
                    "-w", "-t", "60", "start"], check=True, capture_output=True, env=env, cwd=base, **as_user)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                       capture_output=True, env=env, cwd=base, **as_user)
        shutil.rmtree(base, ignore_errors=True)


def new_pg_database(server: str) -> str:
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server.replace("postgresql+psycopg", "postgresql") + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """An empty database: a SQLite file, or a fresh database on the private PostgreSQL cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'settings.db'}"
    return new_pg_database(request.getfixturevalue("pg_server"))
