"""Bearer-token authentication for the HTTP service: tokens map to a tenant and a role.

``require_token`` accepts any valid token; ``require_admin`` additionally needs role ``admin``.
Failures are SB002 errors with HTTP 401 (no/unknown token) or 403 (tenant token on an admin
route); the token itself never appears in an error or a log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request

from ..errors import InvalidConfigError
from .container import Services, services


class AuthError(InvalidConfigError):
    """Missing, malformed, unknown or revoked token."""

    http_status = 401


class ForbiddenError(InvalidConfigError):
    """A valid token without the role the route needs."""

    http_status = 403


@dataclass(frozen=True)
class Principal:
    token_id: str
    tenant_id: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def bearer_value(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def bearer_token(request: Request) -> str | None:
    return bearer_value(request.headers.get("authorization", ""))


VERIFIED = "execbox.verified_token"
"""Scope key: ``(token, TokenRecord)`` the token gate (token_gate.py) verified for this request
before its body was read; ``authenticate`` uses it instead of asking the store a second time."""


def verified(scope: Any, token: str) -> Any | None:
    """The record the token gate verified for ``token`` in this request, or None."""
    found = scope.get(VERIFIED)
    return found[1] if found is not None and found[0] == token else None


def verify_token(token: str | None, store: Any) -> Any:
    """The live token record for ``token``; AuthError (401) when it is missing, unknown or revoked."""
    if token is None:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' "
                        "(create one with `execbox token create`)",
                        details={"header": "Authorization"})
    if store is None:
        raise AuthError("authentication is not configured on this server (no settings store)")
    record = store.tokens.verify(token)
    if record is None:
        raise AuthError("invalid or revoked token", details={"header": "Authorization"})
    return record


def authenticate(request: Request, store: Any) -> Principal:
    """The caller of ``request`` by its bearer token, checked against ``store.tokens`` (once per
    request: the token gate's check is reused)."""
    token = bearer_token(request)
    record = verified(request.scope, token) if token is not None else None
    if record is None:
        record = verify_token(token, store)
        request.scope[VERIFIED] = (token, record)
    return Principal(token_id=record.id, tenant_id=record.tenant_id, role=record.role)


def require_token(request: Request, svc: Services = Depends(services)) -> Principal:
    """FastAPI dependency: any valid token."""
    principal = authenticate(request, svc.store)
    request.state.principal = principal
    return principal


def require_admin(request: Request, svc: Services = Depends(services)) -> Principal:
    """FastAPI dependency: an admin token (tenant tokens get 403)."""
    principal = require_token(request, svc)
    if not principal.is_admin:
        raise ForbiddenError("this endpoint needs an admin token",
                             details={"role": principal.role, "required_role": "admin"})
    return principal
