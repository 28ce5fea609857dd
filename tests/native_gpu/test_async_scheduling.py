"""Async scheduling (step N+1 launched before step N's tokens are read back, its input ids taken from step N's
sampled ids on the device) gives the same outputs as stepping synchronously: EOS, stop strings and stop token
ids ending a request one step late, max_tokens, preemption, abort in flight, a logprobs request (which makes the
engine step synchronously while it runs). Also the persistent step inputs' block-table rows."""
import numpy as np
import pytest
import torch

from modelplex_native_gpu.engine.sampling_params import SamplingParams
from modelplex_native_gpu.engine.step_inputs import StepInputs


@pytest.fixture(scope="module")
def prompts(tokenizer):
    def chat(text):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return [chat("What is the capital of France?"), chat("Name three colours."), chat("Count to five."),
            chat("Say hi.")]


def run(engine, requests, abort_after=None):
    """Add every (prompt, params) at once and step to the end; `abort_after` (step, request index) aborts one."""
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"q{i}", prompt, params)
    finals, steps = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        steps += 1
        if abort_after is not None and steps == abort_after[0]:
            engine.abort(f"q{abort_after[1]}")
    kv = engine.kv_cache_manager
    assert kv.block_pool.num_used_blocks == 0 and not engine.scheduler.requests
    return {rid: (o.token_ids, o.text, o.finish_reason, o.stop_reason, len(o.new_logprobs)) for rid, o in finals.items()}


def both(make_engine, requests, abort_after=None, **config):
    results = []
    for async_scheduling in (False, True):
        engine = make_engine(async_scheduling=async_scheduling, **config)
        results.append(run(engine, requests, abort_after))
    return results


def test_same_outputs_with_eos_stop_strings_stop_ids_and_max_tokens(make_engine, prompts, tokenizer):
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    requests = [(prompts[0], SamplingParams(temperature=0, max_tokens=24)),  # ends on EOS
                (prompts[1], SamplingParams(temperature=0, max_tokens=20, stop=[","])),
                (prompts[0], SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[paris])),
                (prompts[2], SamplingParams(temperature=0, max_tokens=5)),
                (prompts[3], SamplingParams(temperature=0, max_tokens=1)),
                (prompts[2], SamplingParams(temperature=0.8, seed=3, max_tokens=12))]
    sync, overlapped = both(make_engine, requests)
    assert overlapped == sync
    assert sync["q0"][2] == "stop" and sync["q1"][3] == "," and sync["q2"][3] == paris
    assert len(sync["q3"][0]) == 5 and len(sync["q4"][0]) == 1


def test_steps_overlap_and_feed_tokens_on_the_device(make_engine, prompts):
    engine = make_engine(async_scheduling=True)
    engine.add_request("a", prompts[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert engine.step() == []  # the prefill is launched; its token is read back during the next step
    request = engine.scheduler.requests["a"]
    assert request.num_output_placeholders == 1 and request.num_output_tokens == 0
    outputs = engine.step()
    assert [len(o.new_token_ids) for o in outputs] == [1]
    assert engine.runner.inputs.host["token_dst"][0] == 0, "the decode's input id came from the device"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_preemptions == 0


def test_preemption_and_abort_in_flight(make_engine, prompts):
    requests = [(p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)) for p in prompts]
    # 11 blocks of 16 tokens for four ~30-token prompts growing by 40: preemption by recompute
    config = dict(max_model_len=128, kv_cache_memory_bytes=11 * 737280)
    sync, overlapped = both(make_engine, requests, **config)
    assert overlapped == sync
    sync, overlapped = both(make_engine, requests, abort_after=(5, 1), **config)
    assert overlapped == sync and "q1" not in sync


def test_logprobs_request_makes_steps_synchronous(make_engine, prompts):
    requests = [(prompts[0], SamplingParams(temperature=0, max_tokens=8, logprobs=2)),
                (prompts[1], SamplingParams(temperature=0, max_tokens=12)),
                (prompts[2], SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3))]
    sync, overlapped = both(make_engine, requests)
    assert overlapped == sync and sync["q0"][4] == 1  # the last output carries its own token's logprobs


def test_logits_processors_apply_and_step_synchronously(make_engine, prompts, tokenizer):
    """min_tokens and bad_words read the output so far, logit_bias edits the logits: their requests take the
    sampler's full path and make the engine step synchronously; prompt_logprobs are recorded either way."""
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    requests = [(prompts[0], SamplingParams(temperature=0, max_tokens=24, min_tokens=20)),
                (prompts[0], SamplingParams(temperature=0, max_tokens=8, bad_words=["Paris"])),
                (prompts[1], SamplingParams(temperature=0, max_tokens=4, logit_bias={paris: 100})),
                (prompts[2], SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=1)),
                (prompts[3], SamplingParams(temperature=0, max_tokens=10))]
    sync, overlapped = both(make_engine, requests)
    assert overlapped == sync
    assert len(sync["q0"][0]) >= 20, "EOS is masked until min_tokens"
    assert paris not in sync["q1"][0] and "Paris" not in sync["q1"][1]
    assert sync["q2"][0] == [paris] * 4
    found = []
    for async_scheduling in (False, True):
        engine = make_engine(async_scheduling=async_scheduling)
        engine.add_request("p", prompts[2], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1))
        engine.add_request("q", prompts[1], SamplingParams(temperature=0, max_tokens=6))
        while engine.has_unfinished_requests():
            found += [(async_scheduling, o.prompt_logprobs) for o in engine.step()
                      if o.request_id == "p" and o.prompt_logprobs is not None]
    sync_lp = [lp for a, lp in found if not a]
    async_lp = [lp for a, lp in found if a]
    assert sync_lp and len(sync_lp[-1]) == len(prompts[2]) and [list(e) for e in async_lp[-1]] == [
        list(e) for e in sync_lp[-1]]


def test_block_table_rows_are_written_incrementally():
    inputs = StepInputs(max_num_tokens=8, max_num_rows=4, max_blocks_per_seq=6, device=torch.device("cpu"))

    class Request:
        num_preemptions = 0

    a, b = Request(), Request()
    tables = inputs.host["block_tables"]
    tables[:] = -7
    inputs.write_block_table(0, a, [3, 4])
    inputs.write_block_table(0, a, [3, 4, 9])
    assert tables[0, :4].tolist() == [3, 4, 9, -7]
    tables[0, 0] = -1  # a row its owner already wrote is not written again
    inputs.write_block_table(0, a, [3, 4, 9])
    assert tables[0, 0] == -1
    inputs.write_block_table(0, b, [5])  # another request: the row is rewritten
    assert tables[0, :2].tolist() == [5, 4]
    b.num_preemptions = 1  # preempted and readmitted: new blocks
    inputs.write_block_table(0, b, [6, 2])
    assert tables[0, :2].tolist() == [6, 2]
    inputs.clear_rows(0, 2)
    assert tables[:2, 0].tolist() == [0, 0]
    inputs.write_block_table(0, b, [6, 2])
    assert tables[0, :2].tolist() == [6, 2]
    assert np.shares_memory(inputs.host["block_tables"], inputs.device_views["block_tables"].numpy())
