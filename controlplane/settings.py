"""Typed settings of the control plane, from flags, environment (``MOEPLANE_*``) or defaults.

Built explicitly (``Settings(...)``) by the app factory; nothing reads them at import time.
"""

from __future__ import annotations

from typing import Literal

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
    """

    model_config = SettingsConfigDict(env_prefix="MOEPLANE_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = ""
    grpc_listen: str = "127.0.0.1:50051"
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    sample_interval_s: float = 1.0
    max_message_bytes: int = 32 * 1024 * 1024
    dashboard: bool = True
    controller_interval_s: float = 0.5
    rebalance_mode: Literal['auto', 'manual', ''] = ''  # sets the cluster default policy at start
