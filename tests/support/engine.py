"""vllm.LLM in the test process (the caller's conftest sets ONP_BACKEND=cpu before vLLM is imported), the configuration
`vllm serve` builds, and the KV-cached Hugging Face greedy reference of the real-model engine tests."""

from __future__ import annotations

import gc
from pathlib import Path


def make_llm(model: Path, **kwargs):
    from vllm import LLM

    return LLM(model=str(model), seed=0, **kwargs)


def close_llm(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def hf_greedy_cached(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens of a Hugging Face model by plain forward passes over its own KV cache: one pass over the prompt
    (logits of its last position only), then one per token. For the real models (SmolLM2, Gemma 3), where running the
    whole sequence again per token (support.references.hf_greedy) costs tens of seconds."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=1)
        tokens = [int(out.logits[0, -1].argmax())]
        while len(tokens) < new_tokens:
            out = model(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def serve_config(model: Path, usage: str = "OPENAI_API_SERVER", **options):
    """The VllmConfig `vllm serve <model> <options>` builds: vLLM's own serve parser (which the platform's
    pre_register_and_update extends), AsyncEngineArgs.from_cli_args and create_engine_config.

    Options are EngineArgs field names; True/False become --flag/--no-flag, dicts JSON, lists one value each.
    A refusal while parsing raises argparse.ArgumentError (`vllm serve` prints it as a usage error)."""
    import json

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = [str(model)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    args = make_arg_parser(FlexibleArgumentParser(exit_on_error=False)).parse_args(argv)
    args.model = args.model_tag
    return AsyncEngineArgs.from_cli_args(args).create_engine_config(UsageContext(usage))


def block_hasher(block_size: int):
    """vLLM's request block hasher (sha256), as its engine core gives each request with prefix caching on: a Request
    built by hand for a bare scheduler needs one."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)
