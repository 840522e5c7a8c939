"""The service's routers: JSON ingest, OTLP/HTTP, the logs query, and operations."""
