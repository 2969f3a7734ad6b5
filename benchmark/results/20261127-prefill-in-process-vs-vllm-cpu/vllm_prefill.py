import os, sys, time
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    hf = sys.argv[1]; eager = sys.argv[2] == "eager"
    llm = LLM(hf, dtype="float32", max_model_len=2048, max_num_seqs=4, enable_prefix_caching=False, enforce_eager=eager, max_num_batched_tokens=2048)
    sp = SamplingParams(max_tokens=1, temperature=0)
    for n in (1000, 530):
        toks = [(i * 7919) % 49000 + 5 for i in range(n)]
        llm.generate([TokensPrompt(prompt_token_ids=toks)], sp, use_tqdm=False)
        ts = []
        for r in range(5):
            t = time.perf_counter(); llm.generate([TokensPrompt(prompt_token_ids=toks)], sp, use_tqdm=False); ts.append(time.perf_counter() - t)
        print("VLLM", "eager" if eager else "compiled", n, "p50 ms", round(sorted(ts)[2]*1e3,1), "min", round(min(ts)*1e3,1), flush=True)
