"""An in-memory key-value store with a Redis-like command language."""
