"""Durable storage: SQLAlchemy 2 Core tables, engines, idempotent writes and read queries.

The schema is changed only by Alembic migrations (``migrations/``); ``tables.py`` mirrors the
newest migration and the migration test checks they agree.
"""
