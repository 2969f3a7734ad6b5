"""The scheduler and its policies: interleaved prefill, the prefix cache, KV events."""
