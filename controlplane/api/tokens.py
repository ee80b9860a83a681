"""Tokens router (admin only): list, create and revoke API and node tokens.

Revoking a token also ends its open gRPC streams on every replica (published on the bus).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field

from moeplane.controlplane.api.routes import BAD, NOT_FOUND
from moeplane.controlplane.api.rules import rules
from moeplane.controlplane.auth.http import role_extra
from moeplane.controlplane.auth.streams import ENDED_CHANNEL, ended_payload
from moeplane.controlplane.auth.tokens import Role, TokenStore
from moeplane.controlplane.domain.bounds import MAX_INT32

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])
ADMIN = role_extra(Role.ADMIN)


class TokenInfo(BaseModel):
    id: int
    name: str
    role: str
    node_id: str | None
    created_at: float
    revoked_at: float | None


class TokenRequest(BaseModel):
    role: Literal["viewer", "operator", "admin", "node"]
    name: str = Field(default="", max_length=128)
    node_id: str | None = Field(default=None, min_length=1, max_length=128, description="node tokens only")


class CreatedTokenBody(TokenInfo):
    secret: str = Field(description="the token; shown once, only its hash is stored")


def _store(request: Request) -> TokenStore:
    return getattr(request.app.state, "tokens", None) or TokenStore(request.app.state.engine)


@router.get("", response_model=list[TokenInfo], openapi_extra=ADMIN)
async def list_tokens(request: Request) -> list[dict]:
    return await asyncio.to_thread(_store(request).list)


@router.post("", response_model=CreatedTokenBody, status_code=201, responses=BAD,
             openapi_extra=ADMIN | rules("a node token (role node) needs node_id; the other roles must not have one"))
async def create_token(body: TokenRequest, request: Request) -> dict:
    store = _store(request)
    made = await asyncio.to_thread(store.create, body.role, name=body.name, node_id=body.node_id)
    info = await asyncio.to_thread(store.get, made.principal.token_id)
    return info | {"secret": made.secret}


@router.delete("/{token_id}", response_model=TokenInfo, responses=NOT_FOUND, openapi_extra=ADMIN)
async def revoke_token(token_id: Annotated[int, Path(ge=1, le=MAX_INT32)], request: Request) -> dict:
    store = _store(request)
    await asyncio.to_thread(store.revoke, token_id)
    bus = getattr(request.app.state, "bus", None)
    if bus is not None:  # its open gRPC streams end, on every replica
        await bus.publish(ENDED_CHANNEL, ended_payload(token_id=token_id))
    ingest = getattr(request.app.state, "ingest", None)
    if ingest is not None:  # this replica's streams end before the answer; others' through the bus
        ingest.end_streams(ended_payload(token_id=token_id))
    return await asyncio.to_thread(store.get, token_id)
