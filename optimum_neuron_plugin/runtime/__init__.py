"""The runtime: an exported model's graphs, weights and KV cache, and the host loops that call them.

- model.py       NeuronModelForCausalLM: loads the graphs, holds the cache, exposes the loops
- chunk_loop.py  prefill: the per-sequence chunk loop
- decode.py      one decode step (token_generation), on-device or host sampling
- fused.py       a prompt chunk and the decode batch in one chunk_and_decode call
- verify.py      speculative decoding: each row's last token and its drafts in one verify call
- generate.py    Hugging Face style generate()
- graph_set.py   GraphSet: the loaded graphs and which one a call runs (what the host loops take)
- artifact_io.py export and from_pretrained (save_pretrained is model.py's)
- ranks.py       tensor-parallel groups and rank 0's host values
"""

from .decode import DecodeResult
from .model import NeuronModelForCausalLM
from .ranks import tp_group

__all__ = ["DecodeResult", "NeuronModelForCausalLM", "tp_group"]
