"""Test support shared by every test directory: tiny models, HF references, the SmolLM2 GGUF, servers, HTTP.

`tests/conftest.py` puts `tests/` on sys.path, so test modules import these as `support.<module>`.
"""
