"""The provider the settings store selects, for the commands that run code without the service
(``execbox executor``, ``execbox run``).

They use the store's active provider and its stored settings (endpoint, API key, limits), as the
service would, when a store exists: ``EXECBOX_DATABASE_URL`` is set, or ``execbox.db`` is in
``EXECBOX_DATA_DIR`` (default ``./.execbox``). Without one nothing is created (no data directory,
no key file) and they keep their zero-configuration choice: ``SANDBOX_TYPE``, else the jail.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def store_exists() -> bool:
    if os.environ.get("EXECBOX_DATABASE_URL", "").strip():
        return True
    from ..service.store.engine import DEFAULT_DATA_DIR

    data_dir = Path(os.environ.get("EXECBOX_DATA_DIR") or DEFAULT_DATA_DIR).expanduser()
    return (data_dir / "execbox.db").is_file()


def stored_provider(provider: str | None, config: dict[str, Any] | None
                    ) -> tuple[str | None, dict[str, Any] | None, bool]:
    """``(name, config, from_store)``: ``provider`` (None: the store's active provider; None again
    when the store names none, i.e. zero-config) with the settings the store holds for it, which
    ``config``'s values override. Without a store: ``(provider, config, False)``."""
    if not store_exists():
        return provider, config, False
    from ..providers import registry
    from ..service.store.sandbox_settings import SandboxSettings
    from ._store_cli import store_from_cli

    with store_from_cli() as store:
        settings = SandboxSettings(store)
        name = (provider or settings.active() or "").lower() or None
        if name is None or name not in registry.provider_names():
            return name, config, False  # zero-config, or an unknown name get_sandbox reports
        schema = registry.get_provider_class(name).get_config_schema()
        stored = {k: v for k, v in settings.decrypted(name).items() if k in schema}
    return name, {**stored, **(config or {})}, True


__all__ = ["store_exists", "stored_provider"]
