"""Loggers under vLLM's "vllm" logger, so plugin messages share vLLM's handler, format and level."""

from __future__ import annotations

import logging
import time

WARM_UP_LOG_SECONDS = 30.0


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"vllm.plugins.{name}")


class WarmUpLog:
    """A warm-up's progress (runtime warm_up's `progress`): its start, then how far it got every `every` seconds.
    A CPU artifact of many graphs warms up for minutes (each graph's first call is traced), which a silent log
    would make look like a hang."""

    def __init__(self, logger: logging.Logger, what: str, every: float = WARM_UP_LOG_SECONDS) -> None:
        self.logger, self.what, self.every = logger, what, every
        self.began = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == 0:
            self.began = self.last = now
            self.logger.info("warm-up of %s: the first call of each of its %d compiled graphs", self.what, total)
        elif done < total and now - self.last >= self.every:
            self.last = now
            self.logger.info("warm-up of %s: %d of %d graphs in %.0f s", self.what, done, total, now - self.began)
