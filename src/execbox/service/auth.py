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


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def authenticate(request: Request, store: Any) -> Principal:
    """The caller of ``request`` by its bearer token, checked against ``store.tokens``."""
    token = bearer_token(request)
    if token is None:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>' "
                        "(create one with `execbox token create`)",
                        details={"header": "Authorization"})
    if store is None:
        raise AuthError("authentication is not configured on this server (no settings store)")
    record = store.tokens.verify(token)
    if record is None:
        raise AuthError("invalid or revoked token", details={"header": "Authorization"})
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
