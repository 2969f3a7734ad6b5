"""The graph kinds by name and GraphSpec: what one compiled graph is (kind, rows, tokens, bucket, sampling)."""

from __future__ import annotations

from dataclasses import dataclass

CHUNKED_PREFILL = "chunked_prefill"
CONTEXT_ENCODING = "context_encoding"
PROMPT_LOGITS = "prompt_logits"
PREFILL_CHUNKS = (CHUNKED_PREFILL, PROMPT_LOGITS)  # graphs of prompt chunks: per prior (prefill) bucket
TOKEN_GENERATION = "token_generation"
CHUNK_AND_DECODE = "chunk_and_decode"
VERIFY = "verify"
COPY_PREFIX = "copy_prefix"


@dataclass(frozen=True)
class GraphSpec:
    name: str
    rows: int
    tokens: int  # per row (0: copy_prefix, which takes block tables, not tokens)
    samples: bool  # on-device sampling: returns token ids instead of logits
    bucket: int  # cache positions the graph reads: [0, bucket)
    chunk: int = 0  # chunk_and_decode: tokens of the prompt chunk computed with the rows x tokens batch

    narrow: bool = False  # token_generation for fewer rows than batch_size
    bitmask_words: int = 0  # on-device sampling: int32 words of the token bitmask input per row (0: no such input)
    logprobs: int = 0  # on-device sampling: top logprobs returned per row next to the sampled token's (0: tokens only)
    logit_bias: int = 0  # on-device sampling: (token id, bias) pairs per row of the logit_bias input (0: none)
    tail: bool = False  # a tail graph: its prompt chunk is prefill_tail_size tokens, not prefill_chunk_size
    blocks: int = 1  # entries of each row's block table input: sequence_length / block_size
    lora: bool = False  # its rows take an adapter slot input (exports with LoRA slots: models/lora.py)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the graph's prompt chunk (chunk_and_decode's chunk, or a prefill chunk)."""
        return self.chunk or self.tokens

    @property
    def computed_tokens(self) -> int:
        """Tokens one call computes through the layers: rows x tokens, plus chunk_and_decode's chunk."""
        return self.rows * self.tokens + self.chunk

    @property
    def key(self) -> str:
        """Unique per compiled graph: names its file in the artifact."""
        if self.tail:
            return f"{self.name}_t{self.prompt_tokens}_{self.bucket}"
        if self.is_prefill_batch or self.narrow:
            return f"{self.name}_x{self.rows}_{self.bucket}"
        return f"{self.name}_{self.bucket}"

    @property
    def bucket_label(self) -> str:
        """What the bucket bounds, for messages: a chunk's prior context or the cache a call attends."""
        return f"{'prior' if self.name in PREFILL_CHUNKS else 'context'} bucket {self.bucket}"

    @property
    def is_prefill_batch(self) -> bool:
        """A chunked_prefill graph of several prompts (2..prefill_batch_size)."""
        return self.name == CHUNKED_PREFILL and self.rows > 1
