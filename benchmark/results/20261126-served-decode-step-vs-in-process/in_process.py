import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"; os.environ.setdefault("ONP_BACKEND", "cpu"); os.environ["OMP_NUM_THREADS"] = "2"
def main():
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], seed=0, enable_prefix_caching=False)
    prompts = [{"prompt_token_ids": [(i * 7919 + j * 31) % 40000 + 100 for i in range(1000)]} for j in range(4)]
    sp = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0)
    for _ in range(3):
        llm.generate(prompts, sp, use_tqdm=False)
if __name__ == "__main__":
    main()
