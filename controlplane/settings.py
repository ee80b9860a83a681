"""Typed settings of the control plane, from flags, environment (``MOEPLANE_*``) or defaults.

Built explicitly (``Settings(...)``) by the app factory; nothing reads them at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///moeplane.sqlite"


class Settings(BaseSettings):
    """Control-plane configuration.

    database_url: SQLAlchemy URL. ``sqlite:///path`` (embedded default, WAL mode) or
        ``postgresql+psycopg://user@host:port/db``.
    redis_url: ``redis://host:port/db``; empty selects the in-process bus.
    grpc_listen: address of the agent ingest (gRPC) server.
    http_host, http_port: the REST API and dashboard.
    sample_interval_s: device sampling interval told to agents.
    auth: require API tokens (REST) and node tokens (gRPC). Off: the server runs open and
        refuses any listen address that is not loopback.
    tls_certfile, tls_keyfile: PEM files; when both are set HTTP and gRPC use TLS.
    raw_retention_s: raw device frames and step statistics are kept this long, then only tiers.
    loads_retention_s: raw per-step expert loads are kept this long.
    minute_retention_s, hour_retention_s: the 1-min and 1-h tiers (0 = forever).
    rollup_lag_s: a bucket is rolled up once it ended this long ago (late data window).
    retention_interval_s: how often the retention/downsampling job runs (0 = never).
    max_body_bytes: the largest REST request body (413 past it; 8 MiB holds a 58 x 8,192 plan).
    max_steps_ahead: loads and step statistics of a step more than this many steps past the
        job's newest stored step are refused (docs/security.md).
    """

    model_config = SettingsConfigDict(env_prefix="MOEPLANE_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = ""
    grpc_listen: str = "127.0.0.1:50051"
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    sample_interval_s: float = 1.0
    max_message_bytes: int = 32 * 1024 * 1024
    dashboard: bool = True
    controller_interval_s: float = 0.5
    auth: bool = False
    tls_certfile: str = ""
    tls_keyfile: str = ""
    raw_retention_s: float = 2 * 86400.0
    loads_retention_s: float = 14 * 86400.0
    minute_retention_s: float = 30 * 86400.0
    hour_retention_s: float = 0.0
    rollup_lag_s: float = 120.0
    retention_interval_s: float = 60.0
    max_steps_ahead: int = Field(default=1_000_000, ge=1)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    rebalance_mode: Literal['auto', 'manual', ''] = ''  # sets the cluster default policy at start

    @field_validator("grpc_listen")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        """``host:port`` or ``[v6]:port``, port 0..65535 (gRPC would bind 443 without one)."""
        host, sep, port = value.rpartition(":")
        if not sep or not host or host.endswith(":") and not host.startswith("["):
            raise ValueError(f"{value!r} needs host:port (e.g. 127.0.0.1:50051, [::1]:50051)")
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{value!r}: the port must be a number in 0..65535")
        return value
