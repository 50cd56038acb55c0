"""Building a real service app over a store for the admin tests."""

from __future__ import annotations

import json
from pathlib import Path

from execbox.service.crypto import KeyRing, generate_key

SEED = {"system_settings": [
    {"name": "sandbox.provider_type", "source": "variable", "data_type": "string", "value": ""},
    {"name": "sandbox.fallback", "source": "variable", "data_type": "json", "value": "[]"},
    {"name": "sandbox.local", "source": "variable", "data_type": "json", "value": "{\"timeout\": 30}"},
]}


def write_seed(tmp_path: Path) -> Path:
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED))
    return path


def keyring(key: bytes | None = None) -> KeyRing:
    return KeyRing(key or generate_key(), "test key")
