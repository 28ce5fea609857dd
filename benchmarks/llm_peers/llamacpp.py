"""llama.cpp through llama-cpp-python's low-level API: continuous batching over n_seq slots, as llama-server
does with -np (each llama_decode carries one token per decoding sequence plus prefill chunks up to n_batch).

The library may come from a separate llama.cpp build: set LLAMA_CPP_LIB_PATH to its folder with libllama.so.
Greedy argmax in numpy; EOS ignored (every request generates exactly its max_tokens).
"""
import time

import runner


def main():
    args = runner.parse_args(lambda p: (p.add_argument("--slots", type=int, default=64),
                                        p.add_argument("--n-batch", type=int, default=512)))
    import llama_cpp
    import llama_cpp as L
    import numpy as np

    requests = runner.load_requests(args.workload)
    t0 = time.perf_counter()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    max_len = max(len(r["prompt_ids"]) + r["max_tokens"] for r in requests)
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = args.slots * max_len, args.n_batch, args.n_batch, args.slots
    cp.n_threads = cp.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(args.n_batch, 0, 1)
    load_s = time.perf_counter() - t0

    def decode(items):
        """items: (token, pos, seq, wants_logits) -> logits rows of the items that want them."""
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, want
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(items)
        assert L.llama_decode(ctx, batch) == 0, "llama_decode failed"
        n_out = sum(1 for it in items if it[3])
        return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n_out, n_vocab))

    def run_batch(reqs):
        L.llama_memory_clear(mem, True)
        waiting = list(range(len(reqs)))
        active = {}  # slot -> [request index, tokens fed, generated ids]
        generated = 0
        while waiting or active:
            free = [s for s in range(args.slots) if s not in active]
            while waiting and free:
                active[free.pop(0)] = [waiting.pop(0), 0, []]
            items, owners = [], []
            for slot, (r, fed, out) in active.items():  # decodes first
                if fed >= len(reqs[r]["prompt_ids"]):
                    items.append((out[-1], fed, slot, True))
                    owners.append(slot)
            for slot, st in active.items():  # then prefill chunks within n_batch
                r, fed, out = st
                ids = reqs[r]["prompt_ids"]
                while fed < len(ids) and len(items) < args.n_batch:
                    last = fed == len(ids) - 1
                    items.append((ids[fed], fed, slot, last))
                    if last:
                        owners.append(slot)
                    fed += 1
                st[1] = fed
            tokens = decode(items).argmax(axis=1)
            for slot, tok in zip(owners, tokens.tolist()):
                st = active[slot]
                if st[2]:
                    st[1] += 1  # the decode token fed this step
                st[2].append(tok)
                generated += 1
                if len(st[2]) == reqs[st[0]]["max_tokens"]:
                    L.llama_memory_seq_rm(mem, slot, -1, -1)
                    del active[slot]
        return generated

    run_batch(requests[:2])  # warm-up
    runner.serve({"peer": "llama.cpp (llama-cpp-python)", "version": llama_cpp.__version__, "load_s": load_s,
                  "system_info": L.llama_print_system_info().decode()}, run_batch, requests)


if __name__ == "__main__":
    main()
