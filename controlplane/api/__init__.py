"""REST API (FastAPI) under /api/v1: one router per resource, reading the store's query layer."""
