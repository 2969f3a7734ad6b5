import os, sys, time
if __name__ == "__main__":
    import torch
    from torch.profiler import profile, ProfilerActivity
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    hf = sys.argv[1]
    llm = LLM(hf, dtype="float32", max_model_len=2048, max_num_seqs=4, enable_prefix_caching=False, enforce_eager=True, max_num_batched_tokens=2048)
    sp = SamplingParams(max_tokens=1, temperature=0)
    toks = [(i * 7919) % 49000 + 5 for i in range(1000)]
    llm.generate([TokensPrompt(prompt_token_ids=toks)], sp, use_tqdm=False)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        t=time.perf_counter(); llm.generate([TokensPrompt(prompt_token_ids=toks)], sp, use_tqdm=False); print("wall", time.perf_counter()-t)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
