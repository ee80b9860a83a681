"""Agent ingest: the gRPC ``Ingest.Connect`` stream, validation, and batched durable writes."""
