"""Claims router (operator): free a node's devices and ranks so that another node may declare them.

A device belongs to the node that first declared it and a job's rank to the node that first
announced it (``store.claims``); an operator moves them by releasing the old node here. The
node's open streams on every replica end (the bus), and its next hello claims again what is
still free.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel

from moeplane.controlplane.api.routes import NOT_FOUND
from moeplane.controlplane.auth.http import role_extra
from moeplane.controlplane.auth.streams import ENDED_CHANNEL, ended_payload
from moeplane.controlplane.auth.tokens import Role
from moeplane.controlplane.store.claims import release_node

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"])


class Released(BaseModel):
    node_id: str
    job_id: str | None
    ranks: list[int]
    devices: list[str]


@router.delete("/{node_id}/claims", response_model=Released, responses=NOT_FOUND,
               openapi_extra=role_extra(Role.OPERATOR))
async def release_claims(node_id: Annotated[str, Path(min_length=1, max_length=128)], request: Request) -> dict:
    released = await asyncio.to_thread(release_node, request.app.state.engine, node_id)
    bus = getattr(request.app.state, "bus", None)
    if bus is not None:
        await bus.publish(ENDED_CHANNEL, ended_payload(node_id=node_id))
    ingest = getattr(request.app.state, "ingest", None)
    if ingest is not None:  # this replica's streams end before the answer; others' through the bus
        ingest.end_streams(ended_payload(node_id=node_id))
    return released
