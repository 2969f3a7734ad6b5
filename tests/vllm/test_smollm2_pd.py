"""Prefill/decode disaggregation of SmolLM2 through PromptStorageConnector, with real `vllm serve` processes.

Two kv_producer servers and one kv_consumer server of the session's SmolLM2 export (tests/conftest.py `smollm2`) on
127.0.0.1, behind the proxy (benchmark/tools/pd_proxy.py: the prompt to a prefill server with max_tokens=1, then to
the decode server). 1P1D: prefill0 alone; 2P1D: both in turn. prefill0 prefills whole prompts in one step (serial),
prefill1 in chunks over steps (interleaved, the default), as does the decode server. Every answer is greedy-equal to
transformers on the same GGUF weights, token for token.

What each server did for a request is read from its runner's records (ONP_STATS_FILE, runner/stats.py) and vLLM's
metrics: the decode server loaded the KV of every prompt token but the last (the partial last block included) and
fed the last one as a decode row, so it ran no prefill graph for the request, where the prefill server ran one per
chunk. The failure cases (an unreadable stored entry, a prefill server killed mid-request) are in
test_pd_disaggregation.py, on the tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from support.client import completion_tokens, concurrently, greedy
from support.engine import hf_greedy_cached
from support.pd import SERIAL, connector, external_hits, finished, proxy, records, stats_env
from support.server import Server
from support.smollm2 import SHAPE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # three live SmolLM2 servers

CHUNK = SHAPE["prefill_chunk_size"]
NEW_TOKENS = 8
# 16 chats per run, 2 to 6 chunks long, distinct within a run; 65, 97, 129 and 161 are k blocks + 1 tokens (every
# token but the last is whole blocks: the export's block size is the chunk, 32).
LENGTHS = [40, 65, 97, 129, 161, 52, 75, 110, 140, 186, 45, 88, 120, 150, 58, 100]
PASSAGE = (
    "The Loire is the longest river in France. It rises in the Massif Central, flows north towards Orleans, then "
    "turns west and reaches the Atlantic Ocean near Saint-Nazaire. Its valley is known for its castles, built by "
    "kings and nobles between the fifteenth and the seventeenth centuries, and for its vineyards, which produce "
    "white wines from Sauvignon and Chenin grapes. The river is shallow in summer and floods in winter and spring, "
    "so it was never an easy route for boats, although flat barges carried salt, wine and stone along it for "
    "centuries. The Seine is shorter but more navigable: it crosses Paris and Rouen and ends at Le Havre, on the "
    "English Channel. The Rhone comes from a glacier in Switzerland, crosses Lake Geneva, meets the Saone at Lyon "
    "and ends in a delta near Marseille, where rice is grown and wild horses live in the marshes. The Garonne rises "
    "in the Pyrenees, passes Toulouse and Bordeaux and joins the Dordogne to form the Gironde estuary, the largest "
    "in Western Europe. Together these rivers drain most of the country, and canals built since the seventeenth "
    "century link them, so that a barge can travel from the Mediterranean to the North Sea without going to sea."
)
# Each chat starts with its own question (its first KV block differs from every other chat's: no prefix-cache hit
# between them), then the passage.
QUESTIONS = [
    "Which river flows through Paris?",
    "Where does the Loire end?",
    "Name a grape grown in the Loire valley.",
    "How long is the Rhone, roughly?",
    "Summarize the text below in one sentence.",
    "Is the Loire easy to navigate?",
    "Write a short poem about rivers.",
    "List three French cities.",
    "What grows in the Rhone delta?",
    "Translate the first sentence into Spanish.",
    "Why did barges carry salt?",
    "Give the text below a title.",
    "Explain what an estuary is.",
    "Count the rivers named below.",
    "Describe the Gironde estuary.",
    "Could a barge reach the North Sea?",
    "Tell me about the castles mentioned.",
    "Compare the Seine and the Loire.",
    "Answer briefly: where is Lyon?",
    "Please rewrite this for a child.",
    "Find the mountains named below.",
    "Make a quiz question from this text.",
    "Does the Garonne pass Toulouse?",
    "Extract every city name below.",
    "Rate how clear this passage is.",
    "Continue the story of a barge trip.",
    "Pick the river you would sail on.",
    "Suggest a travel plan along the Seine.",
    "Guess when the canals were built.",
    "Note any wine regions mentioned.",
    "Check whether the Rhone meets the Saone.",
    "Define the word delta as used below.",
]


@dataclass
class PD:
    """The servers, and where the runners of the decode server and of prefill0 record their requests."""

    prefill0: Server
    prefill1: Server
    decode: Server
    root: Path


@pytest.fixture(scope="module")
def pd(smollm2, tmp_path_factory):
    """The two producers and the consumer, started together (they share the cores' time)."""
    root = tmp_path_factory.mktemp("smollm2-pd")
    storage, artifact = root / "kv", smollm2.directory
    storage.mkdir()
    started = PD(
        Server(
            artifact, root / "prefill0.log", *connector("kv_producer", storage), *SERIAL,
            env=stats_env(root / "prefill0.jsonl"),
        ),
        Server(artifact, root / "prefill1.log", *connector("kv_producer", storage)),
        Server(artifact, root / "decode.log", *connector("kv_consumer", storage), env=stats_env(root / "decode.jsonl")),
        root,
    )  # fmt: skip
    servers = (started.prefill0, started.prefill1, started.decode)
    try:
        for server in servers:
            server.wait_ready(600)
        yield started
    finally:
        for server in servers:
            server.stop()


def chats(smollm2, run: int) -> list[list[int]]:
    """The run's 16 chats: each its own question and the passage, the passage cut to the chat's length (token ids of
    the chat template); the lengths in another order in each run."""
    im_end = smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")
    lengths = LENGTHS[5 * run :] + LENGTHS[: 5 * run]
    prompts = []
    for question, length in zip(QUESTIONS[16 * run : 16 * run + 16], lengths, strict=True):
        whole = smollm2.chat_ids(f"{question}\n\n{PASSAGE}")
        end = len(whole) - whole[::-1].index(im_end) - 1  # where the user's turn ends
        prompts.append(whole[: length - (len(whole) - end)] + whole[end:])
    assert [len(p) for p in prompts] == lengths
    return prompts


def split_answers(pd: PD, prompts: list[list[int]], prefill: list[Server]) -> list[list[int]]:
    """The prompts' greedy tokens, sent concurrently through the proxy."""
    body = lambda prompt: greedy(pd.decode.model, prompt, NEW_TOKENS)  # noqa: E731
    with proxy(prefill, pd.decode) as running:
        return concurrently(lambda p: completion_tokens(running.port, body(p)), prompts, workers=len(prompts))


def decode_work(pd: PD, prompts: list[list[int]]) -> list[tuple[int, int]]:
    """The decode server's (cached_tokens, prefill_calls) of each prompt."""
    done = records(pd.decode, pd.root / "decode.jsonl")
    return [(done[len(p)]["cached_tokens"], done[len(p)]["prefill_calls"]) for p in prompts]


def test_1p1d_answers_equal_transformers_and_the_decode_side_runs_no_prefill_graph(pd, smollm2):
    prompts, hits_before = chats(smollm2, run=0), external_hits(pd.decode)
    split = split_answers(pd, prompts, [pd.prefill0])
    assert split == [hf_greedy_cached(smollm2.hf, p, NEW_TOKENS) for p in prompts]
    # Every prompt token but the last loaded (cached_tokens), no prefill graph call: the last token was a decode row.
    assert decode_work(pd, prompts) == [(len(p) - 1, 0) for p in prompts]
    assert external_hits(pd.decode) - hits_before == sum(len(p) - 1 for p in prompts)
    # The prefill server computed the prompts: one chunk graph call per chunk, from no cached token.
    prefilled = records(pd.prefill0, pd.root / "prefill0.jsonl")
    assert [(prefilled[len(p)]["cached_tokens"], prefilled[len(p)]["prefill_calls"]) for p in prompts] == [
        (0, -(-len(p) // CHUNK)) for p in prompts
    ]


def test_2p1d_answers_equal_transformers_with_both_prefill_servers_used(pd, smollm2):
    prompts, before = chats(smollm2, run=1), {"prefill0": finished(pd.prefill0), "prefill1": finished(pd.prefill1)}
    hits_before = external_hits(pd.decode)
    split = split_answers(pd, prompts, [pd.prefill0, pd.prefill1])
    assert split == [hf_greedy_cached(smollm2.hf, p, NEW_TOKENS) for p in prompts]
    after = {"prefill0": finished(pd.prefill0), "prefill1": finished(pd.prefill1)}
    assert {name: after[name] - count for name, count in before.items()} == {"prefill0": 8, "prefill1": 8}
    assert decode_work(pd, prompts) == [(len(p) - 1, 0) for p in prompts]
    assert external_hits(pd.decode) - hits_before == sum(len(p) - 1 for p in prompts)
