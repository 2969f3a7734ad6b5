"""Host sampling and token constraints (logits processing, grammar bitmasks)."""
