import sys
sys.path.insert(0, "tests")
from pathlib import Path
from support.served import smollm2_tokenizer
from support.tiny_models import save_tiny, export
root = Path("/tmp/pp")
hf = save_tiny(root / "tiny-hf-2048", "llama", seed=0, tokenizer=smollm2_tokenizer(), tie_word_embeddings=False,
               max_position_embeddings=2048)
art = export(hf, root / "pool-32", batch_size=32, sequence_length=2048, prefill_chunk_size=256, block_size=128,
             num_blocks=129, prefill_batch_size=4, on_device_sampling=True, decode_batch_sizes=(1, 8, 16, 32),
             context_buckets=(2048,), prefill_buckets=(0, 2048))
print(art)
