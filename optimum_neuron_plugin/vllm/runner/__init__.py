"""The runner's step: the step's input, the call plan, the calls, fallbacks, health, request state."""
