"""Admin token routes for the console's Tokens page (``/api/admin/tokens``; admin token required).

The same operations as ``execbox token create|list|revoke``: a new token's plaintext is in the
create response only (the store keeps its SHA-256); listings show the fixed ``ebx_`` tag and the
last 4 characters only. An admin cannot revoke the token its own request is using, so the console
cannot lock itself out.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import InvalidConfigError
from ..service.auth import Principal, require_admin
from ..service.container import services
from ..service.sessions.workspace import NAME_PATTERN  # the service's one rule for tenant ids
from ..service.store.safe_text import control_character

router = APIRouter(prefix="/api/admin/tokens", tags=["admin tokens"])


class UnknownTokenError(InvalidConfigError):
    http_status = 404


class OwnTokenError(InvalidConfigError):
    http_status = 409


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str = Field(pattern=NAME_PATTERN, max_length=64, description="Tenant the token acts for")
    role: Literal["tenant", "admin"] = "tenant"
    name: str | None = Field(default=None, max_length=128,
                             description="A label to recognise it by (no control characters)")

    @field_validator("name")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        bad = control_character(value) if value is not None else None
        if bad is not None:  # a NUL failed PostgreSQL's insert (500) and was stored as is on SQLite
            raise ValueError(f"must not contain control characters (found {bad})")
        return value


@router.get("")
def list_tokens(request: Request, include_revoked: bool = Query(default=False),
                principal: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Tokens, never whole: ``token`` is ``ebx_...`` + last 4; ``current`` marks the caller's own."""
    records = services(request).store.tokens.list(include_revoked=include_revoked)
    return {"tokens": [{**r.to_dict(), "current": r.id == principal.token_id} for r in records]}


@router.post("", status_code=201)
def create_token(body: TokenCreate, request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Create a token; ``secret`` holds its plaintext, in this response only."""
    rec, plaintext = services(request).store.tokens.create(body.tenant_id, body.role, body.name)
    return {"token": {**rec.to_dict(), "current": False}, "secret": plaintext,
            "message": "Store this token now: it is not shown again"}


@router.delete("/{token_id}")
def revoke_token(request: Request, token_id: str = Path(pattern=r"^tok_[0-9a-f]{1,64}$"),
                 principal: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Revoke a token: new requests using it get 401 at once. What it already started is not
    stopped: runs in flight finish, its sessions and background processes keep running under
    the tenant (docs/admin.md)."""
    if token_id == principal.token_id:
        raise OwnTokenError("this is the token you are signed in with; revoke it from another admin token",
                            details={"field": "token_id"})
    store = services(request).store
    if not store.tokens.revoke(token_id):
        raise UnknownTokenError(f"no active token with id {token_id!r}", details={"field": "token_id"})
    rec = store.tokens.get(token_id)
    return {"revoked": rec.to_dict() if rec else {"id": token_id}}
