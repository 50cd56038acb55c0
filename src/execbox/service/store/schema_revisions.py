"""Which schema revisions this execbox knows, and the migrations it refuses to run.

A database stamped with a revision that is not among this execbox's migrations was written by a
newer execbox: nothing here can read or migrate it, so every command that opens it answers one
SB002 naming both revisions instead of Alembic's traceback. Downgrades are not supported: a
target older than the database's revision is refused, never reported as done.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError

from ...errors import InvalidConfigError

MIGRATIONS = Path(__file__).with_name("migrations")


def script_directory() -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def known_revisions() -> list[str]:
    """This execbox's revisions, oldest first."""
    return [r.revision for r in reversed(list(script_directory().walk_revisions()))]


def is_newer(current: str | None) -> bool:
    """True when ``current`` (a database's revision) is one this execbox does not know."""
    return current is not None and current not in known_revisions()


def newer_database_error(current: str, database: str) -> InvalidConfigError:
    head = script_directory().get_current_head()
    return InvalidConfigError(
        f"the settings database {database} is at schema revision {current}, which this execbox (schema head "
        f"{head}) does not know: a newer execbox wrote it. Run that newer execbox, or restore a backup made "
        "before the upgrade (downgrades are not supported)",
        details={"database": database, "revision": current, "head": head})


def check_upgrade(current: str | None, target: str, database: str) -> None:
    """SB002 unless migrating a database at ``current`` to ``target`` is an upgrade (or nothing)
    this execbox can do: the database's revision must be known, ``target`` a known revision (or
    ``head``) that is not older than ``current``."""
    if is_newer(current):
        raise newer_database_error(str(current), database)
    if target in ("head", "heads"):
        return
    script = script_directory()
    try:
        wanted = script.get_revision(target)
    except (CommandError, RevisionError):
        wanted = None
    if wanted is None:
        raise InvalidConfigError(f"unknown schema revision {target!r}: this execbox knows "
                                 f"{', '.join(known_revisions())} (or head)",
                                 details={"revision": target, "known": known_revisions()})
    if current is not None and wanted.revision != current and wanted.revision in {
            r.revision for r in script.iterate_revisions(current, "base")}:
        raise InvalidConfigError(
            f"the settings database {database} is at revision {current}, newer than {wanted.revision}: "
            "downgrades are not supported (restore a backup made before the upgrade instead)",
            details={"database": database, "revision": current, "target": wanted.revision})


__all__ = ["check_upgrade", "is_newer", "known_revisions", "newer_database_error", "script_directory"]
