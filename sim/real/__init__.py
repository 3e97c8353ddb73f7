"""The real executor's pieces: transformers models whose KV and state live in the pool."""
