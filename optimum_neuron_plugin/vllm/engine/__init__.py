"""Fitting vLLM's engine to an artifact: options, limits, refusals, request checks."""
