"""Connecting to the store's database and migrating it (Alembic, scripts shipped in-package)."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from ...errors import InvalidConfigError, ProviderUnavailableError
from .repos import AuditRepo, SettingsRepo, TokensRepo
from .schema_revisions import check_upgrade

MIGRATIONS = Path(__file__).with_name("migrations")
DEFAULT_DATA_DIR = "./.execbox"


def data_dir_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """EXECBOX_DATA_DIR, default ./.execbox; created with 0700 (it holds the key file).

    One another user may write to is refused: whoever can create or rename files in it can put
    their own database (with their own admin token) or key file in place of the service's."""
    path = Path(data_dir or os.environ.get("EXECBOX_DATA_DIR") or DEFAULT_DATA_DIR).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_mode & 0o022 or st.st_uid not in (os.geteuid(), 0):
        raise InvalidConfigError(
            f"data directory {path} can be written by other users (owner uid {st.st_uid}, mode "
            f"{st.st_mode & 0o7777:o}): they could replace its database or key file. Run "
            f"chown {os.geteuid()} {path} && chmod 700 {path}, or point EXECBOX_DATA_DIR elsewhere",
            details={"field": "EXECBOX_DATA_DIR", "path": str(path)})
    return path


def database_url(data_dir: str | os.PathLike[str] | None = None, url: str | None = None) -> str:
    url = url or os.environ.get("EXECBOX_DATABASE_URL") or ""
    if url:
        # Plain postgresql:// means psycopg 3 here (the driver execbox installs).
        return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url)
    return f"sqlite:///{data_dir_path(data_dir) / 'execbox.db'}"


HIDDEN = "****"  # as secrets are shown ('****' + at most the last 4 characters: none for a URL)
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|credential", re.IGNORECASE)
_SENTINEL = "EXECBOXREDACTED0"  # alphanumeric: survives URL quoting unchanged


def redact_url(url: str) -> str:
    """The database URL with its password hidden, for logs, errors and the admin status: the
    ``user:password@`` password (also with an empty user) and the value of every password-like query
    parameter (``?password=``, ``sslpassword``, ``token``...). A string SQLAlchemy cannot parse is
    masked by pattern instead: everything before the last ``@`` and secret-like parameter values.
    So is one whose host holds an ``@``: SQLAlchemy ends the password at the first ``@`` of an
    unescaped one and takes the rest of it for the host (review 50, F6)."""
    try:
        parsed = make_url(url)
        if "@" in (parsed.host or ""):
            return _redact_unparsable(url)
        secret_params = {k: _SENTINEL for k in parsed.query if _SECRET_PARAM.search(k)}
        if secret_params:
            parsed = parsed.update_query_dict(secret_params)
        if parsed.password is not None:
            # replaced before rendering (render_as_string(hide_password=True) would show '***')
            parsed = parsed.set(password=_SENTINEL)
        return parsed.render_as_string(hide_password=False).replace(_SENTINEL, HIDDEN)
    except Exception:  # noqa: BLE001 - any parse failure: fall back to the pattern
        return _redact_unparsable(url)


def _redact_unparsable(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:  # userinfo may hold any character: hide everything up to the last '@'
        rest = HIDDEN + "@" + rest.rsplit("@", 1)[1]
    rest = re.sub(r"([?&;][^=&;#]*(?:pass|pwd|secret|token|key|auth|credential)[^=&;#]*=)[^&;#]*",
                  rf"\1{HIDDEN}", rest, flags=re.IGNORECASE)
    return scheme + sep + rest


def _scrub(message: str, url: str) -> str:
    """``message`` (a driver's or SQLAlchemy's error text) without the URL's password or secret
    query values, should it quote them."""
    secrets: list[str] = []
    try:
        parsed = make_url(url)
        secrets += [parsed.password or "", (parsed.host or "").rpartition("@")[0]]
        secrets += [v for k, vals in parsed.query.items() if _SECRET_PARAM.search(k)
                    for v in ((vals,) if isinstance(vals, str) else vals)]
    except Exception:  # noqa: BLE001 - unparsable: what the pattern would hide
        rest = url.partition("://")[2] or url
        if "@" in rest:
            userinfo = rest.rsplit("@", 1)[0]
            secrets += [userinfo, userinfo.partition(":")[2]]
        secrets += re.findall(r"[?&;][^=&;#]*(?:pass|pwd|secret|token|key|auth|credential)[^=&;#]*=([^&;#]*)",
                              url, flags=re.IGNORECASE)
    message = message.replace(url, redact_url(url))
    for secret in sorted((s for s in secrets if s and len(s) >= 3), key=len, reverse=True):
        message = message.replace(secret, HIDDEN)
    return message


def _alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATION_LOCK = 0x65786278  # "exbx": advisory lock id, so concurrent first boots migrate once


@contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations up to ``revision`` (idempotent). Processes starting together on an
    empty database take turns: a file lock (SQLite), an advisory lock (PostgreSQL, MySQL)."""
    cfg = _alembic_config(engine.url.render_as_string(hide_password=False))
    dialect = engine.dialect.name
    if dialect == "sqlite":
        with _file_lock(engine), engine.begin() as conn:
            _migrate(cfg, conn, revision)
        return
    lock, unlock = {
        "postgresql": (f"SELECT pg_advisory_lock({MIGRATION_LOCK})", f"SELECT pg_advisory_unlock({MIGRATION_LOCK})"),
        "mysql": ("SELECT GET_LOCK('execbox_migrate', 300)", "SELECT RELEASE_LOCK('execbox_migrate')"),
    }.get(dialect, (None, None))
    with engine.connect() as conn:
        if lock:
            conn.exec_driver_sql(lock)
            conn.commit()
        try:
            with conn.begin():
                _migrate(cfg, conn, revision)
        finally:
            if unlock:
                conn.exec_driver_sql(unlock)
                conn.commit()


def _migrate(cfg: Config, conn: Connection, revision: str) -> None:
    """command.upgrade, after refusing (SB002) a database from a newer execbox, an unknown target
    and a downgrade (schema_revisions.check_upgrade); checked under the migration lock."""
    database = redact_url(conn.engine.url.render_as_string(hide_password=False))
    check_upgrade(MigrationContext.configure(conn).get_current_revision(), revision, database)
    cfg.attributes["connection"] = conn
    try:
        command.upgrade(cfg, revision)
    except CommandError as e:  # anything check_upgrade did not foresee: still SB002, no traceback
        raise InvalidConfigError(f"cannot migrate the settings database {database} to {revision!r}: {e}",
                                 details={"database": database, "revision": revision}) from None


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()


def _private_db_file(path: str) -> None:
    """The SQLite file (audit log, session registry, token hashes) readable by its owner only,
    whatever the data directory's mode: SQLite gives its -wal and -shm files the database file's
    mode. Created here if absent; an existing file is narrowed to 0600 when we own it."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return  # sqlite reports what is wrong with the path
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for extra in ("-wal", "-shm"):
        try:
            if os.stat(path + extra).st_mode & 0o077:
                os.chmod(path + extra, 0o600)
        except OSError:
            pass


PG_CONNECT_TIMEOUT = 5  # seconds (libpq's minimum is 2)
PG_TCP_USER_TIMEOUT_MS = 15000
PG_POOL_TIMEOUT = 10  # seconds a request waits for a free pooled connection


def _make_engine(url: str) -> Engine:
    """``hide_parameters``: a failing statement's error (logged with its traceback) never carries
    the values bound to it: submitted code, file paths, token names (review 47, F2)."""
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")
        if not memory:
            _private_db_file(make_url(url).database or "")
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               hide_parameters=True, **({"poolclass": StaticPool} if memory else {}))

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    # No pre-ping (it doubles the round trips of the per-execution version check); a connection
    # the server dropped is invalidated on first use and SettingsRepo.version() retries once.
    # A database that stops answering fails requests within seconds (503 SB009) instead of
    # hanging them: libpq gives up connecting after PG_CONNECT_TIMEOUT and on a connection whose
    # sent data goes unacknowledged for PG_TCP_USER_TIMEOUT_MS; keepalives find dead peers.
    return create_engine(url, pool_size=5, max_overflow=10, pool_recycle=1800, pool_timeout=PG_POOL_TIMEOUT,
                         hide_parameters=True,
                         connect_args={"connect_timeout": PG_CONNECT_TIMEOUT,
                                       "tcp_user_timeout": PG_TCP_USER_TIMEOUT_MS, "keepalives": 1,
                                       "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3})



class Store:
    """The database behind the service: settings, tokens, audit, the session registry, E2B sandboxes."""

    def __init__(self, engine: Engine, data_dir: Path) -> None:
        self.engine = engine
        self.data_dir = data_dir
        sessions = sessionmaker(engine, expire_on_commit=False)
        self.settings = SettingsRepo(sessions)
        self.tokens = TokensRepo(sessions)
        self.audit = AuditRepo(sessions)
        from .e2b_repo import E2BSandboxRepo
        from .sessions_repo import SqlSessionRegistry

        self.sessions = SqlSessionRegistry(sessions)
        self.e2b = E2BSandboxRepo(sessions)

    @property
    def url(self) -> str:
        return redact_url(self.engine.url.render_as_string(hide_password=False))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except SQLAlchemyError:
            return False

    def revision(self) -> str | None:
        return current_revision(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(data_dir: str | os.PathLike[str] | None = None, url: str | None = None,
               migrate: bool = True) -> Store:
    """Connect (EXECBOX_DATABASE_URL, else SQLite in EXECBOX_DATA_DIR) and migrate to head."""
    path = data_dir_path(data_dir)
    full_url = database_url(path, url)
    try:
        if "@" in (make_url(full_url).host or ""):  # an unescaped '@' in the password (review 50, F6)
            raise ValueError("'@' in the host")
    except Exception:  # noqa: BLE001 - ArgumentError, ValueError (a port that is not a number), ...
        # never the parser's text: it quotes a fragment of the URL, e.g. the tail of a password
        # with an unescaped '@' (review 36, F6)
        raise InvalidConfigError(f"EXECBOX_DATABASE_URL {redact_url(full_url)!r} is not a valid database URL "
                                 "(dialect+driver://user:password@host:port/database): percent-encode special "
                                 "characters such as @ : / # ? % in the user name and password",
                                 details={"field": "EXECBOX_DATABASE_URL"}) from None
    try:
        engine = _make_engine(full_url)
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise InvalidConfigError(f"EXECBOX_DATABASE_URL {redact_url(full_url)!r} is not usable: "
                                 f"{_scrub(str(e), full_url)}",
                                 details={"field": "EXECBOX_DATABASE_URL"}) from None
    try:
        if migrate:
            upgrade(engine)
        else:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
    except InvalidConfigError:  # a database from a newer execbox (schema_revisions): SB002
        engine.dispose()
        raise
    except SQLAlchemyError as e:
        engine.dispose()
        raise ProviderUnavailableError(
            f"settings database {redact_url(full_url)} is unreachable: {type(e.__cause__ or e).__name__}: "
            f"{_scrub(str(e.__cause__ or e).splitlines()[0], full_url) if str(e.__cause__ or e) else ''}",
            details={"database": redact_url(full_url)},
        ) from None
    return Store(engine, path)
