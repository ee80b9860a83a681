"""gRPC side of access control: ``authorization: Bearer <token>`` metadata on Ingest.Connect.

A node token may write only its own node; an admin token may write any node (tools, tests).
Missing, unknown or revoked → UNAUTHENTICATED; a viewer/operator token or another node's
token → PERMISSION_DENIED. Revoking a token ends its open streams (``ENDED_CHANNEL``).
"""

from __future__ import annotations

import grpc

from moeplane.controlplane.auth.tokens import Principal, Role, TokenStore, bearer

# Bus channel on which a revoked token (b"token:<id>") or a node whose claims an operator
# released (b"node:<node_id>") is announced: every replica ends that token's or node's open
# Ingest.Connect streams (UNAUTHENTICATED).
ENDED_CHANNEL = "auth.ended"


def ended_payload(*, token_id: int | None = None, node_id: str | None = None) -> bytes:
    """What to publish on ENDED_CHANNEL to end the streams of a token or of a node."""
    return f"token:{token_id}".encode() if token_id is not None else f"node:{node_id}".encode()


class IngestDenied(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


def metadata_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return bearer(value if isinstance(value, str) else value.decode())
    return None


def authenticate_stream(tokens: TokenStore, metadata) -> Principal:
    """The stream's principal, or IngestDenied (UNAUTHENTICATED / PERMISSION_DENIED)."""
    principal = tokens.authenticate(metadata_token(metadata))
    if principal is None:
        raise IngestDenied(grpc.StatusCode.UNAUTHENTICATED, "a valid node token is required")
    if principal.role not in (Role.NODE, Role.ADMIN):
        raise IngestDenied(grpc.StatusCode.PERMISSION_DENIED, f"a {principal.role} token may not ingest")
    return principal


def check_node(principal: Principal | None, node_id: str) -> None:
    """PERMISSION_DENIED when ``principal`` is a node token of another node."""
    if principal is not None and principal.role is Role.NODE and principal.node_id != node_id:
        raise IngestDenied(
            grpc.StatusCode.PERMISSION_DENIED,
            f"this token belongs to node {principal.node_id!r}, not {node_id!r}",
        )
