"""vLLM's streaming input (AsyncLLM.generate with an async generator of StreamingInput): a session's next input
continues from the KV blocks vLLM kept for its tokens so far, and its tokens are those of one request with the whole
context."""

from __future__ import annotations

import asyncio

import pytest
from support.references import hf_greedy
from support.served import prompt_of

pytestmark = pytest.mark.slow  # an AsyncLLM with its engine process

NEW_TOKENS = 5


@pytest.fixture(scope="module")
def engine(chunked_dir):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # the engine process starts in seconds
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(chunked_dir), seed=0))
        yield llm
        llm.shutdown()


def params():
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)


async def tokens_of(engine, request_id: str, prompt) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(prompt, params(), request_id):
        tokens += out.outputs[0].token_ids
    return tokens


async def session(engine, first: list[int], second: list[int]) -> list[int]:
    """Two inputs; the second is sent once the first's tokens are out (the session waits for it in between)."""
    from vllm.v1.engine.async_llm import StreamingInput

    first_done = asyncio.Event()

    async def inputs():
        yield StreamingInput(prompt={"prompt_token_ids": list(first)})  # copies: vLLM extends a session's list
        await first_done.wait()
        yield StreamingInput(prompt={"prompt_token_ids": list(second)})

    tokens: list[int] = []
    async for out in engine.generate(inputs(), params(), "session"):
        tokens += out.outputs[0].token_ids
        if len(tokens) >= NEW_TOKENS:
            first_done.set()
    return tokens


def test_a_resumed_session_continues_where_its_tokens_are(engine, tokenizer, tiny_hf):
    first, second = prompt_of(21, tokenizer), prompt_of(9, tokenizer, offset=5)
    others = [prompt_of(n, tokenizer, offset=3 + n) for n in (40, 3, 17)]

    async def run() -> tuple[list[list[int]], list[list[int]]]:  # one event loop: AsyncLLM's output handler's
        concurrent = await asyncio.gather(
            session(engine, first, second),
            *(tokens_of(engine, f"other-{i}", {"prompt_token_ids": p}) for i, p in enumerate(others)),
        )
        turn1 = concurrent[0][:NEW_TOKENS]
        # The session drops the first input's last sampled token (vLLM's streaming input), then the second input.
        alone = [first, first + turn1[:-1] + second, *others]
        return concurrent, [await tokens_of(engine, f"alone-{i}", {"prompt_token_ids": p}) for i, p in enumerate(alone)]

    (streamed, *other_tokens), alone = asyncio.run(run())
    assert [streamed[:NEW_TOKENS], streamed[NEW_TOKENS:], *other_tokens] == alone
    turn1 = streamed[:NEW_TOKENS]
    assert turn1 == hf_greedy(tiny_hf, first, NEW_TOKENS)
    assert streamed[NEW_TOKENS:] == hf_greedy(tiny_hf, first + turn1[:-1] + second, NEW_TOKENS)
