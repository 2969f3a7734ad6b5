"""Ask one chat question, greedily, either through the Python API or a running server.

python scripts/chat.py api EXPORTED_DIR "question"
python scripts/chat.py server http://127.0.0.1:8000 "question"
"""

from __future__ import annotations

import sys


def ask_api(directory: str, question: str) -> str:
    from optimum_neuron_plugin import NeuronModelForCausalLM

    model = NeuronModelForCausalLM.from_pretrained(directory)
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    ids = model.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=64)
    return model.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def ask_server(url: str, question: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=64, temperature=0
    )
    return reply.choices[0].message.content


if __name__ == "__main__":
    mode, target, question = sys.argv[1:4]
    answer = ask_api(target, question) if mode == "api" else ask_server(target, question)
    print(f"Q: {question}\nA: {answer}")
