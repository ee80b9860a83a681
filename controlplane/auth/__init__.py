"""Access control: API tokens with roles (viewer < operator < admin) and per-node agent tokens.

Tokens are random secrets shown once; only their sha256 is stored. Every check reads the
store, so a revoked token stops working on the next request.
"""

from moeplane.controlplane.auth.tokens import Principal, Role, TokenStore

__all__ = ["Principal", "Role", "TokenStore"]
