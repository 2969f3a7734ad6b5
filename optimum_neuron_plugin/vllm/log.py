"""Loggers under vLLM's "vllm" logger, so plugin messages share vLLM's handler, format and level."""

from __future__ import annotations

import logging


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"vllm.plugins.{name}")
