"""E2B sandboxes in the settings database (table ``e2b_sandboxes``, store/e2b_repo.py).

What a sandbox adds to its session is kept in the store, so a sandbox outlives a restart of
``execbox serve`` and every replica on the same database knows it. Two of its fields are
secrets, and neither is stored in the clear:

- the **access token** the SDK sends to the sandbox URL is never stored: it is an HMAC of the
  sandbox id under the settings' secret key (which every replica shares, as it must to read the
  provider secrets). A token made under a key that ``execbox secrets rotate`` replaced is still
  accepted while that key is kept for decryption;
- the **env vars** (``Sandbox.create(envs=...)``, often API keys) are encrypted with that key
  (AES-GCM, bound to the sandbox id); ``execbox secrets rotate`` re-encrypts them with the
  provider secrets. A sandbox whose env vars no key at hand can decrypt keeps running without
  them, and says so in the log.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from ..crypto import KeyRing
from .registry import E2BSandbox

log = logging.getLogger("execbox.service.e2b")

_TOKEN_LABEL = b"execbox e2b sandbox access token\x00"


def _token(key: bytes, sandbox_id: str) -> str:
    digest = hmac.new(key, _TOKEN_LABEL + sandbox_id.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class SandboxStore:
    """Rows of ``e2b_sandboxes`` <-> sandboxes. ``keyring`` is called per use and must give the
    current key ring (``SandboxSettings.keyring`` reloads when a key file changed): after a
    rotation, new env vars and tokens are under the new key at once."""

    def __init__(self, repo: Any, keyring: Callable[[], KeyRing]) -> None:
        self.repo = repo
        self._keyring = keyring

    def tokens(self, sandbox_id: str, ring: KeyRing | None = None) -> tuple[str, tuple[str, ...]]:
        """The access token to hand out (under the primary key) and the older ones still accepted."""
        ring = self._keyring() if ring is None else ring
        return _token(ring.primary, sandbox_id), tuple(_token(k, sandbox_id) for k in ring.others)

    def insert(self, sb: E2BSandbox) -> None:
        ring = self._keyring()  # one ring, the current one: the token and the env vars under one key
        sb.access_token, sb.accepted = self.tokens(sb.sandbox_id, ring)
        self.repo.insert({
            "sandbox_id": sb.sandbox_id, "tenant_id": sb.tenant_id, "template": sb.template,
            "meta": json.dumps(sb.metadata, sort_keys=True),
            "env_vars": ring.encrypt(json.dumps(sb.env_vars, sort_keys=True), self._aad(sb.sandbox_id))
            if sb.env_vars else "",
            "token_id": sb.token_id, "started_at": sb.started_at, "end_at": sb.end_at,
            "session_created": sb.session_created, "paused_left": sb.paused_left})

    def sandbox(self, row: dict[str, Any]) -> E2BSandbox:
        sid = str(row["sandbox_id"])
        sb = E2BSandbox(sid, str(row["tenant_id"]), str(row["template"]), json.loads(row["meta"] or "{}"),
                        self._env_vars(sid, row["env_vars"]), float(row["end_at"]), token_id=row["token_id"],
                        started_at=float(row["started_at"]), session_created=row["session_created"])
        self.refresh(sb, row)
        return sb

    def refresh(self, sb: E2BSandbox, row: dict[str, Any]) -> None:
        """What other replicas (or this one's routes) may have changed since ``sb`` was read, and
        its tokens under the keys at hand now (a rotation applies at once)."""
        sb.end_at = float(row["end_at"])
        sb.paused_left = row["paused_left"]
        sb.access_token, sb.accepted = self.tokens(sb.sandbox_id)

    def _env_vars(self, sandbox_id: str, stored: str) -> dict[str, str]:
        if not stored:
            return {}
        try:
            return dict(json.loads(self._keyring().decrypt(stored, self._aad(sandbox_id))))
        except Exception as e:  # noqa: BLE001 - the sandbox goes on without them, and the log says why
            log.warning("e2b sandbox %s: its env vars cannot be decrypted (%s); it runs without them",
                        sandbox_id, type(e).__name__)
            return {}

    @staticmethod
    def _aad(sandbox_id: str) -> str:
        return f"e2b_sandboxes.{sandbox_id}.env_vars"  # store/sandbox_settings.reencrypt_all uses the same
