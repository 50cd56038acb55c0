"""The list of environment variables execbox reads (env_names.py) cannot go stale: every
EXECBOX_*/SANDBOX_* name written under src/ is in it, and every one the docs name is known (or
read only by the scripts and tests). Unknown names get a did-you-mean (review 50, F8)."""

from __future__ import annotations

import re
from pathlib import Path

from execbox.env_names import (
    KNOWN,
    NOT_ENVIRONMENT,
    REPLACED,
    SCRIPT_ONLY,
    provider_field_names,
    unknown_name_warnings,
    unknown_names,
)

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(?:EXECBOX|SANDBOX)_[A-Z0-9_]*[A-Z0-9]\b")


def _names_in(paths) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in paths:
        if "__pycache__" in path.parts or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for name in NAME.findall(text):
            found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_name_in_the_source_is_known() -> None:
    # the package only: src/execbox.egg-info is pip's copy of the README (the docs test covers it)
    found = _names_in(p for p in (ROOT / "src" / "execbox").rglob("*") if p.name != "env_names.py")
    assert "EXECBOX_DATABASE_URL" in found  # the scan does see the source
    missing = {n: where for n, where in found.items() if n not in KNOWN | NOT_ENVIRONMENT}
    assert not missing, f"add these to execbox/env_names.py KNOWN: {missing}"


def test_every_name_the_docs_mention_is_known() -> None:
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    fields = provider_field_names()
    found = _names_in(p for p in docs if "device-runs" not in p.parts)  # dated reports, kept as run
    unknown = {n: where for n, where in found.items()
               if n not in KNOWN | SCRIPT_ONLY | fields | set(REPLACED)
               and not n.startswith("SANDBOX_TENANT_MAX_")}
    unknown.pop("SANDBOX_HOST", None)  # RAGFlow's own, where the docs say how to point RAGFlow here
    unknown.pop("EXECBOX_DATABSE_URL", None)  # the misspelling admin.md shows the warning for
    assert not unknown, unknown


def test_unknown_names_get_the_nearest_known_one() -> None:
    env = {"EXECBOX_DATABSE_URL": "postgresql://db/x", "EXECBOX_SECRETKEY": "k", "SANDBOX_IDLE_TIMOUT": "5",
           "EXECBOX_JAIL_TIMOUT": "5", "EXECBOX_ZZZ_QQQ": "1",
           # known: read by the service, a provider field on first boot, a script; not ours at all
           "EXECBOX_DATABASE_URL": "x", "EXECBOX_JAIL_TIMEOUT": "5", "EXECBOX_VERIFY_PYTHON": "python3",
           "PATH": "/bin", "MY_EXECBOX_THING": "1"}
    assert unknown_names(env) == {"EXECBOX_DATABSE_URL": "EXECBOX_DATABASE_URL",
                                  "EXECBOX_JAIL_TIMOUT": "EXECBOX_JAIL_TIMEOUT",
                                  "EXECBOX_SECRETKEY": "EXECBOX_SECRET_KEY",
                                  "EXECBOX_ZZZ_QQQ": None,
                                  "SANDBOX_IDLE_TIMOUT": "SANDBOX_IDLE_TIMEOUT"}
    lines = unknown_name_warnings({"EXECBOX_DATABSE_URL": "x"})
    assert lines == ["warning: EXECBOX_DATABSE_URL is not an environment variable execbox reads; it is "
                     "ignored (did you mean EXECBOX_DATABASE_URL?)"]
    assert "postgresql" not in " ".join(unknown_name_warnings(env))  # names only, never values


def test_a_python_constant_is_not_a_known_variable_and_contract_names_point_to_their_replacement() -> None:
    """SANDBOX_UID is a constant (boxes/images.py), read from no environment: setting it warns. The
    gateway contract's SANDBOX_WORKER_IMAGE / SANDBOX_MEM_LIMIT are not read: the warning says what is."""
    assert not NOT_ENVIRONMENT & KNOWN
    assert unknown_name_warnings({"SANDBOX_UID": "5"}) == [
        "warning: SANDBOX_UID is not an environment variable execbox reads; it is ignored"]
    fields = provider_field_names()
    assert {"EXECBOX_DOCKER_IMAGE", "EXECBOX_DOCKER_MAX_MEMORY"} <= fields  # the replacements the warning names
    [memory, image] = unknown_name_warnings({"SANDBOX_WORKER_IMAGE": "x", "SANDBOX_MEM_LIMIT": "1g"})  # sorted
    assert image.startswith("warning: SANDBOX_WORKER_IMAGE ") and "EXECBOX_DOCKER_IMAGE" in image
    assert memory.startswith("warning: SANDBOX_MEM_LIMIT ") and "EXECBOX_DOCKER_MAX_MEMORY" in memory
    assert not set(REPLACED) & (KNOWN | SCRIPT_ONLY | fields)
