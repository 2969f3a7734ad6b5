"""An adapter asked of /v1/load_lora_adapter (or of SageMaker's /adapters), checked against the export before vLLM
loads it.

vLLM's serving layer answers every error the engine raises in add_lora with 500, whatever its reason
(entrypoints/openai/models/serving.py, load_lora_adapter); a 400 can only come from a check that runs before it. The
export's own checks (runtime/lora/peft_adapter.py `check`: the adapter's config and its tensors' shapes and dtypes,
no weight read) run here, in the API server, from the request body (http_checks.py): an adapter the export cannot
hold is answered 400 with what to change and never reaches the engine. A name already loaded is vLLM's own 400.
"""

from __future__ import annotations

import functools
import json

from ...artifact import load_config, load_neuron_config
from ...config import NeuronConfig
from ...errors import InputError
from ...models.args import ModelArgs
from ...runtime.lora import peft_adapter


def load_refusal(artifact: str, body: bytes, name_field: str, path_field: str) -> str | None:
    """What is wrong with the adapter a load request names (its body's `name_field` and `path_field`), for the export
    at `artifact`; None: it fits, or the body is not a load request vLLM would read (vLLM answers it)."""
    try:
        asked = json.loads(body)
    except ValueError:
        return None
    path = asked.get(path_field) if isinstance(asked, dict) else None
    if not isinstance(path, str) or not path or not asked.get(name_field):
        return None
    try:
        peft_adapter.check(path, *_export(artifact))
    except InputError as error:
        return str(error)
    return None


@functools.cache
def _export(artifact: str) -> tuple[ModelArgs, NeuronConfig]:
    return load_config(artifact)[1], load_neuron_config(artifact)
