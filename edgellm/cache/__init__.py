"""What the model remembers: KV caches and their row types, the prompt cache of
prefixes, and sessions saved to disk."""
