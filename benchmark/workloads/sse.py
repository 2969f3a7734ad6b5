"""The events of an OpenAI-compatible streamed response (server-sent `data: {...}` lines, `[DONE]` left out)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp


async def stream_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """Each event of a 200 response, parsed; any other status raises with the server's answer."""
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
    async for line in response.content:
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            yield json.loads(line[6:])
