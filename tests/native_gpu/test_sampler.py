"""Sampler on synthetic logits: greedy, top-k/top-p/min-p, penalties, seeds, logprobs."""
import pytest
import torch

from modelplex_native_gpu.engine.request import EngineRequest
from modelplex_native_gpu.engine.sampler import Sampler
from modelplex_native_gpu.engine.sampling_params import SamplingParams

VOCAB = 8


def req(rid="r", prompt=(1, 2), **params):
    return EngineRequest(rid, list(prompt), SamplingParams(**params))


def logits_rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def sample(logits, requests, seed=0):
    return Sampler(torch.device("cpu"), seed).sample(logits, requests, list(range(len(requests))), len(requests))


def test_greedy_batch_is_argmax_per_row():
    logits = logits_rows([0, 3, 1, 0, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0, 0, 9])
    out = sample(logits, [req(temperature=0), req(temperature=0)])
    assert out.token_ids == [1, 7] and out.logprobs == [None, None]


@pytest.mark.parametrize("vocab", [49152, 49157, 7])  # SmolLM2's; a tail after the last 16 floats; < 16
def test_compiled_argmax_is_torchs_first_largest_index(ops, vocab):
    """Ties (the first index wins, within a vector, across vectors and in the tail), -inf rows, a NaN (torch
    returns the first one), rows that are slices of a wider tensor; and the greedy sampler path through it."""
    g = torch.Generator().manual_seed(vocab)
    wide = torch.randn(9, vocab + 3, generator=g)
    logits = wide[:, 1:vocab + 1]
    logits[1, [3, vocab - 1]] = 50.0  # a tie, the later one in the tail for 49157
    logits[2, [vocab // 2, vocab // 3]] = 50.0
    logits[3] = float("-inf")
    logits[4, [vocab - 2, 1]] = float("nan")
    logits[5, :] = 1.0
    logits[6, vocab - 1] = 60.0
    got = ops.argmax_rows(logits)
    assert got.tolist() == logits.argmax(dim=-1).tolist()
    assert got[1] == 3 and got[2] == min(vocab // 2, vocab // 3) and got[3] == 0 and got[4] == 1
    sampler = Sampler(torch.device("cpu"), argmax_rows=ops.argmax_rows)
    requests = [req(str(i), temperature=0) for i in range(9)]
    assert sampler.sample_on_device(logits, requests).tolist() == got.tolist()
    with pytest.raises(RuntimeError, match="logits"):
        ops.argmax_rows(logits.double())


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=0.01), dict(min_p=1.0)])
def test_filters_that_leave_only_the_top_token(params):
    logits = logits_rows([0.0, 2.0, 1.9, 1.8, 0, 0, 0, 0]).repeat(50, 1)
    requests = [req(str(i), temperature=1.0, **params) for i in range(50)]
    assert sample(logits, requests).token_ids == [1] * 50


def test_top_k_two_draws_only_the_two_best():
    logits = logits_rows([0.0, 2.0, 1.9, 1.8, 0, 0, 0, 0]).repeat(200, 1)
    tokens = sample(logits, [req(str(i), temperature=1.0, top_k=2) for i in range(200)]).token_ids
    assert set(tokens) == {1, 2}


def test_temperature_sampling_follows_the_distribution():
    p = torch.tensor([0.75, 0.25])
    logits = torch.full((4000, VOCAB), -1e9)
    logits[:, :2] = p.log()
    tokens = torch.tensor(sample(logits, [req(str(i), temperature=1.0) for i in range(4000)]).token_ids)
    assert abs((tokens == 0).float().mean().item() - 0.75) < 0.03


def test_seed_makes_a_request_independent_of_its_batch():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))
    alone = [sample(logits[1:2], [req("s", temperature=1.0, seed=42)], seed=s).token_ids[0] for s in (0, 1)]
    batched = sample(logits, [req("a", temperature=1.0), req("s", temperature=1.0, seed=42),
                              req("b", temperature=0.5)], seed=7).token_ids[1]
    assert alone[0] == alone[1] == batched


def test_seeded_request_continues_its_own_stream():
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(1, VOCAB)
    a, b = req("a", temperature=1.0, seed=5), req("b", temperature=1.0, seed=5)
    seq_a = [sampler.sample(logits, [a], [0], 1).token_ids[0] for _ in range(8)]
    seq_b = [sampler.sample(logits, [b], [0], 1).token_ids[0] for _ in range(8)]
    assert seq_a == seq_b and len(set(seq_a)) > 1


def test_repetition_penalty_pushes_seen_tokens_down():
    logits = logits_rows([0, 2.0, 1.5, 0, 0, 0, 0, -1.0])
    assert sample(logits, [req(prompt=(1, 7), temperature=0, repetition_penalty=2.0)]).token_ids == [2]


def test_presence_and_frequency_penalties_use_output_tokens():
    logits = logits_rows([0, 2.0, 1.5, 0, 0, 0, 0, 0])
    r = req(prompt=(3,), temperature=0, frequency_penalty=0.3)
    r.append_token(1)
    r.append_token(1)  # 2.0 - 2 * 0.3 = 1.4 < 1.5
    assert sample(logits, [r]).token_ids == [2]
    r = req(prompt=(3,), temperature=0, presence_penalty=0.6)  # 2.0 - 0.6 = 1.4 < 1.5
    r.append_token(1)
    assert sample(logits, [r]).token_ids == [2]


def test_logprobs_of_sampled_and_top_tokens():
    logits = logits_rows([0, 2.0, 1.5, 0, 0, 0, 0, 0])
    out = sample(logits, [req(temperature=0, logprobs=2)])
    want = torch.log_softmax(logits[0], -1)
    assert set(out.logprobs[0]) == {1, 2}
    assert out.logprobs[0][1] == pytest.approx(want[1].item()) and out.logprobs[0][2] == pytest.approx(want[2].item())
