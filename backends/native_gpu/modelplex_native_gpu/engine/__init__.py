"""The engine core: requests, paged KV cache, scheduler, model runner, sampler and the engine loops."""
