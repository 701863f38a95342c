"""The engine's pure parts: admission and chunked prefill, stop strings, the batch cache."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import pytest
import torch

from handlers.generation.cache import BatchCache
from handlers.generation.detokenize import StopMatcher
from handlers.generation.scheduler import EngineLimits, Scheduler


@dataclass(eq=False)
class Seq:
    request_id: str
    prompt_len: int
    reserved: int
    prefilled: int = 0
    prompt_key: Hashable = field(default_factory=object)  # a prompt of its own unless given


def scheduler(running=2, cached=100, chunk=10) -> Scheduler:
    return Scheduler(EngineLimits(running, cached, 64, chunk))


def test_admission_is_first_come_first_served_within_both_budgets():
    s = scheduler(running=2, cached=100)
    a, b, c, d = Seq("a", 5, 60), Seq("b", 5, 50), Seq("c", 5, 10), Seq("d", 5, 10)
    for seq in (a, b, c, d):
        s.add(seq)
    assert s.admit() == [a]  # b does not fit beside a; c, though small, may not overtake b
    s.remove(a)
    assert s.admit() == [b, c]  # two running at most
    assert s.reserved_tokens == 60 and list(s.waiting) == [d]
    s.remove(d)  # cancelled while waiting: frees nothing it did not hold
    assert s.reserved_tokens == 60 and len(s) == 2


@pytest.mark.parametrize(
    ("prompts", "chunk", "plan"),
    [
        ([4], 10, [("a", 0, 4)]),
        ([25], 10, [("a", 0, 10)]),
        ([4, 25, 3], 10, [("a", 0, 4), ("b", 0, 6)]),
        ([3, 3, 3], 10, [("a", 0, 3), ("b", 0, 3), ("c", 0, 3)]),
    ],
)
def test_each_step_prefills_at_most_one_chunk_oldest_first(prompts, chunk, plan):
    s = scheduler(running=4, cached=1000, chunk=chunk)
    for key, n in zip("abc", prompts, strict=False):
        s.add(Seq(key, n, n + 5))
    s.admit()
    got = s.plan_prefill()
    assert [(c.sequence.request_id, c.start, c.end) for c in got] == plan


def test_a_long_prompt_moves_to_running_after_its_last_chunk():
    s = scheduler(running=4, cached=1000, chunk=10)
    seq = Seq("a", 25, 30)
    s.add(seq)
    s.admit()
    spans = []
    while s.prefilling:
        (chunk,) = s.plan_prefill()
        spans.append((chunk.start, chunk.end, chunk.last))
        s.prefilled(chunk)
    assert spans == [(0, 10, False), (10, 20, False), (20, 25, True)]
    assert s.running == [seq] and s.find("a") is seq


@pytest.mark.parametrize(
    ("prompts", "chunk", "plan"),
    [  # (key, length) per sequence in admission order; plan: (first, start, end, riders)
        ([("p", 5), ("p", 5), ("q", 4), ("p", 5)], 10, [("a", 0, 5, "bd"), ("c", 0, 4, "")]),
        ([("p", 5), ("p", 5)], 3, [("a", 0, 3, "")]),  # riders wait for the first's last chunk
        ([("q", 9), ("p", 5), ("p", 5)], 8, [("a", 0, 8, "")]),  # the budget ran out: both wait
        ([("q", 6), ("p", 5), ("p", 5), ("r", 3)], 8, [("a", 0, 6, ""), ("b", 0, 2, "")]),
    ],
)
def test_equal_prompts_prefill_once_and_the_later_ones_ride_on_the_last_chunk(prompts, chunk, plan):
    s = scheduler(running=8, cached=1000, chunk=chunk)
    for request_id, (key, n) in zip("abcd", prompts, strict=False):
        s.add(Seq(request_id, n, n + 5, prompt_key=key))
    s.admit()
    got = s.plan_prefill()
    assert [
        (c.sequence.request_id, c.start, c.end, "".join(r.request_id for r in c.riders))
        for c in got
    ] == plan


def test_riders_move_to_running_with_their_first_and_one_takes_over_if_it_leaves():
    s = scheduler(running=8, cached=1000, chunk=4)
    a, b, c = (Seq(key, 6, 10, prompt_key="p") for key in "abc")
    for seq in (a, b, c):
        s.add(seq)
    s.admit()
    (chunk,) = s.plan_prefill()
    assert (chunk.sequence, chunk.end, chunk.riders) == (a, 4, ())
    s.prefilled(chunk)
    s.remove(a)  # cancelled half way: b is the first now, from its own start
    (chunk,) = s.plan_prefill()
    assert (chunk.sequence, chunk.start, chunk.end, chunk.riders) == (b, 0, 4, ())
    s.prefilled(chunk)
    (chunk,) = s.plan_prefill()
    assert (chunk.sequence, chunk.start, chunk.end, chunk.riders) == (b, 4, 6, (c,))
    s.prefilled(chunk)
    assert s.prefilling == [] and s.running == [b, c] and c.prefilled == 6
    assert s.reserved_tokens == 20


@pytest.mark.parametrize(
    ("stops", "parts", "emitted", "stopped"),
    [
        ((), ["ab", "cd"], ["ab", "cd"], False),
        (("END",), ["abc E", "N", "D tail"], ["abc ", "", ""], True),
        (("END",), ["abc E", "N", "x"], ["abc ", "", "ENx"], False),
        (("xy", "b"), ["axy"], ["a"], True),
        (("ab",), ["a", "a", "b"], ["", "a", ""], True),
    ],
)
def test_stop_strings_hold_back_what_may_begin_one(stops, parts, emitted, stopped):
    m = StopMatcher(stops)
    assert [m.feed(p) for p in parts] == emitted
    assert m.stopped == stopped


def test_stop_matcher_flushes_its_tail_when_the_sequence_ends_otherwise():
    m = StopMatcher(("END",))
    assert m.feed("to the E") == "to the "
    assert m.flush() == "E"


def _one(length: int, value: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.full((1, 2, length, 4), value)
    return [(t, t.clone())]


def test_the_batch_cache_keeps_rows_compact_and_writes_each_row_at_its_length():
    batch = BatchCache()
    batch.join("a", _one(3, 1.0), 3)
    assert batch.step_mask() is None  # one row sees every column: no mask needed
    batch.join("b", _one(5, 2.0), 5)
    assert batch.positions().tolist() == [3, 5]
    mask = batch.step_mask()
    assert mask is not None and mask[:, 0, 0].tolist() == [
        [True, True, True, True, False, False],  # a attends to its 3 positions and the new one
        [True, True, True, True, True, True],
    ]
    batch.begin_step()
    new = torch.stack([torch.full((2, 4), 7.0), torch.full((2, 4), 8.0)])
    keys, _ = batch.write(0, new, new)
    assert keys.shape == (2, 2, 6, 4)  # rows x heads x (longest row + the new column) x dim
    assert keys[0, 0, :, 0].tolist()[:4] == [1.0, 1.0, 1.0, 7.0]  # a's new key at its length
    assert keys[1, 0, :, 0].tolist() == [2.0] * 5 + [8.0]
    batch.advanced()
    assert batch.positions().tolist() == [4, 6]
    batch.join("c", _one(2, 3.0), 2)
    assert batch.padded_tokens == 18  # 3 rows x the longest row (6)
    batch.leave({"a"})  # the last row moves into the hole
    assert batch.keys == ["c", "b"] and batch.positions().tolist() == [2, 6]
    assert batch.layers[0][0][0, 0, :2, 0].tolist() == [3.0, 3.0]
    for _ in range(20):  # rows grow past the first capacity
        batch.begin_step()
        batch.write(0, torch.zeros(2, 2, 4), torch.zeros(2, 2, 4))
        batch.advanced()
    assert batch.positions().tolist() == [22, 26] and batch.layers[0][0].shape[2] >= 27
    batch.join("long", _one(400, 4.0), 400)
    assert batch.layers[0][0].shape[2] >= 401
    batch.leave({"long"})  # the memory it took is given back
    assert batch.layers[0][0].shape[2] < 200 and batch.positions().tolist() == [22, 26]
    assert batch.layers[0][0][1, 0, :26, 0].tolist() == [2.0] * 5 + [8.0] + [0.0] * 20
    batch.leave({"b", "c"})
    assert len(batch) == 0 and batch.padded_tokens == 0 and batch.layers == []


def test_a_batch_cache_that_keeps_its_memory_grows_in_large_steps_and_never_moves_back():
    batch = BatchCache(keep_memory=True)  # the engine's on a GPU with CUDA graphs
    batch.join("a", _one(3, 1.0), 3)
    tensor = batch.layers[0][0]
    assert tensor.shape[2] >= 3 + 256  # one step of 256 columns, not 64
    batch.join("long", _one(400, 4.0), 400)
    grown = batch.layers[0][0]
    assert grown.shape[2] >= 400 + 256
    batch.leave({"long"})  # no shrink: the tensors (and graphs over them) stay put
    assert batch.layers[0][0] is grown and batch.positions().tolist() == [3]
    batch.leave({"a"})
    assert len(batch) == 0 and batch.layers[0][0] is grown
    batch.join("b", _one(5, 2.0), 5)  # an empty batch reuses them
    assert batch.layers[0][0] is grown and batch.layers[0][0][0, 0, :5, 0].tolist() == [2.0] * 5


def test_min_tokens_masks_eos_and_stop_ids_until_enough_tokens():
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler

    logits = torch.tensor([0.0, 5.0, 4.0, 3.0])  # EOS (1) first, then stop id 2, then 3
    sampler = Sampler(
        SamplingParams(temperature=0, min_tokens=3, stop_token_ids=frozenset({2})), [0], [1]
    )
    assert [sampler.choose(logits)[0] for _ in range(4)] == [3, 3, 3, 1]
    assert sampler.is_stop_token(1) and sampler.is_stop_token(2) and not sampler.is_stop_token(3)
    assert not Sampler(SamplingParams(ignore_eos=True), [], [1]).is_stop_token(1)


def test_penalties_and_seeded_sampling():
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler

    logits = torch.tensor([2.0, 1.9, -1.0])
    repeat = Sampler(SamplingParams(temperature=0, repetition_penalty=2.0), [0], [])
    assert repeat.choose(logits)[0] == 1  # 2.0 / 2 < 1.9: the prompt's token is penalised
    freq = Sampler(SamplingParams(temperature=0, frequency_penalty=0.5), [], [])
    assert [freq.choose(logits)[0] for _ in range(3)] == [0, 1, 0]  # 2.0-0.5 < 1.9; 1.9-0.5 < 1.5
    wide = torch.randn(50, generator=torch.Generator().manual_seed(0))
    first, again = (
        Sampler(SamplingParams(seed=1, top_k=10, top_p=0.9), [], []).choose(wide)[0] for _ in "ab"
    )
    assert first == again
    top10 = set(torch.topk(wide, 10).indices.tolist())
    seq = Sampler(SamplingParams(seed=3, top_k=10), [], [])
    assert {seq.choose(wide)[0] for _ in range(40)} <= top10


def _packed(values: list[float], lengths: list[int]):
    """One layer's packed keys (and values, negated): sequence i's positions hold values[i]."""
    t = torch.cat(
        [torch.full((1, 2, n, 4), value) for value, n in zip(values, lengths, strict=True)], dim=2
    )
    return [(t, -t)]


def test_sequences_packed_side_by_side_join_in_one_copy_past_the_first_capacity():
    batch = BatchCache()
    lengths = [30, 50, 40, 20, 60, 10]  # 210 packed tokens: more than the first row's columns
    offsets = [0, 30, 80, 120, 140, 200]
    keys = [f"s{i}" for i in range(6)]
    batch.join_packed(keys, lengths, offsets, _packed([1.0, 2, 3, 4, 5, 6], lengths))
    assert batch.keys == keys and batch.positions().tolist() == lengths
    k, v = batch.layers[0]
    assert k.shape[0] >= 6 and k.shape[2] >= 61  # rows doubled, columns past the longest
    for row, (n, value) in enumerate(zip(lengths, [1.0, 2, 3, 4, 5, 6], strict=True)):
        assert k[row, :, :n].eq(value).all() and v[row, :, :n].eq(-value).all()
        assert k[row, :, n:].eq(0).all()  # nothing written past its length
    batch.join_packed(["t"], [5], [3], _packed([9.0], [8]))  # from an offset, beside the rest
    assert batch.positions().tolist() == [*lengths, 5] and batch.layers[0][0].shape[0] >= 7
    assert batch.layers[0][0][6, 0, :5, 0].tolist() == [9.0] * 5


def test_many_rows_leave_at_once_and_the_last_rows_fill_the_holes():
    batch = BatchCache()
    lengths = [3, 4, 5, 6, 7, 8]
    offsets = [0, 3, 7, 12, 18, 25]
    batch.join_packed(list("abcdef"), lengths, offsets, _packed([1.0, 2, 3, 4, 5, 6], lengths))
    batch.leave({"a", "c", "f"})
    assert sorted(batch.keys) == ["b", "d", "e"] and len(batch) == 3
    values = {"b": 2.0, "d": 4.0, "e": 5.0}
    for row, key in enumerate(batch.keys):
        n = batch.lengths[row]
        assert n == lengths["abcdef".index(key)]
        assert batch.layers[0][0][row, :, :n].eq(values[key]).all()
        assert batch.layers[0][1][row, :, :n].eq(-values[key]).all()
    batch.leave({"nobody"})
    assert len(batch) == 3


def test_plain_greedy_rows_share_one_argmax_and_the_others_choose_alone():
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler, choose_tokens, sample_rows

    logits = torch.tensor(
        [
            [0.0, 5.0, 4.0, 3.0],  # EOS (1) banned for its first 2 tokens: 2
            [9.0, 1.0, 0.0, 0.0],  # plain greedy: 0
            [0.0, 1.0, 2.0, 8.0],  # sampled with the step's other sampled rows, by its seed
            [0.0, 0.0, 7.0, 1.0],  # logprobs asked: its own sampler, greedy with logprobs
        ]
    )

    def samplers() -> list[Sampler]:
        return [
            Sampler(SamplingParams(temperature=0, min_tokens=2), [], [1]),
            Sampler(SamplingParams(temperature=0), [], [1]),
            Sampler(SamplingParams(temperature=1.0, seed=3), [], [1]),
            Sampler(SamplingParams(temperature=0, logprobs=1), [], [1]),
        ]

    rows = samplers()
    tokens = [[c[0] for c in choose_tokens(rows, logits.clone())] for _ in range(3)]  # type: ignore[index]
    assert [t[:2] for t in tokens] == [[2, 0], [2, 0], [1, 0]]  # two tokens out: EOS allowed
    assert [t[3] for t in tokens] == [2, 2, 2]
    again = [Sampler(SamplingParams(temperature=1.0, seed=3), [], [1])]
    assert [t[2] for t in tokens] == [int(sample_rows(again, logits[2:3])[0]) for _ in range(3)]
    choice = choose_tokens(samplers()[3:], logits[3:].clone())[0]
    assert not isinstance(choice, Exception) and choice[1] is not None
    assert choice[1].token_id == 2 and choice[1].top[0][0] == 2


@pytest.mark.parametrize(
    ("params", "banned_first"),
    [
        ({"temperature": 1.0}, False),
        ({"temperature": 0.7, "top_k": 3}, False),
        ({"temperature": 1.3, "top_p": 0.8}, False),
        ({"temperature": 1.0, "top_k": 4, "top_p": 0.9, "min_tokens": 1}, True),
    ],
)
def test_sampling_rows_together_draws_from_the_same_distribution_as_one_by_one(
    params: dict, banned_first: bool
) -> None:
    """4,000 rows sampled together (`sample_rows`, each its own seed) and 4,000 tokens of the
    per-sequence sampler (`Sampler.choose`) against the filtered softmax they both draw from."""
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler, sample_rows

    row = torch.tensor([0.5, 2.0, 1.0, 1.5, -1.0, 0.0])
    n = 4000
    together = [Sampler(SamplingParams(seed=i, **params), [], [1]) for i in range(n)]
    drawn = sample_rows(together, row.repeat(n, 1))
    alone = Sampler(SamplingParams(seed=1, **params), [], [1])
    one_by_one = []
    for _ in range(n):
        alone._generated = 0  # min_tokens applies to every draw, as to the first
        one_by_one.append(alone.choose(row)[0])
    # the distribution both draw from: banned, then temperature, top-k, top-p
    logits = row.clone()
    if banned_first:
        logits[1] = float("-inf")
    logits = logits / params["temperature"]
    if params.get("top_k"):
        logits[logits < torch.topk(logits, params["top_k"]).values[-1]] = float("-inf")
    if params.get("top_p", 1.0) < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        p = torch.softmax(ordered, -1)
        drop = p.cumsum(-1) - p >= params["top_p"]
        logits[order[drop]] = float("-inf")
    expected = torch.softmax(logits, -1)
    for tokens in (drawn.tolist(), one_by_one):
        seen = torch.bincount(torch.tensor(tokens), minlength=len(row)).float() / n
        assert (seen - expected).abs().max() < 0.03, (seen, expected)
        assert all(seen[i] == 0 for i in range(len(row)) if expected[i] == 0)


def test_a_seeded_row_samples_the_same_tokens_whatever_is_sampled_beside_it() -> None:
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler, sample_rows

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    seeded = SamplingParams(temperature=1.0, seed=11)
    alone_sampler = Sampler(seeded, [], [1])
    alone = [int(sample_rows([alone_sampler], logits[1:2])[0]) for _ in range(5)]
    crowd = [Sampler(SamplingParams(temperature=0.5), [], [1]), Sampler(seeded, [], [1])]
    crowd.append(Sampler(SamplingParams(temperature=2.0, top_k=5), [], [1]))
    beside = [int(sample_rows(crowd, logits)[1]) for _ in range(5)]
    assert beside == alone


def test_a_row_whose_stop_ids_ban_every_token_fails_alone() -> None:
    from handlers.exceptions import PredictionException
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import BANNED_ALL, Sampler, choose_tokens

    everything = SamplingParams(temperature=1.0, min_tokens=2, stop_token_ids=frozenset({0, 2}))
    greedy = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=frozenset({0, 2}))
    rows = [Sampler(everything, [], [1]), Sampler(SamplingParams(temperature=1.0), [], [1])]
    rows += [Sampler(greedy, [], [1]), Sampler(SamplingParams(temperature=0.0), [], [1])]
    logits = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 0.0], [0.0, 1.0, 3.0], [0.0, 1.0, 3.0]])
    choices = choose_tokens(rows, logits)
    for failed in (choices[0], choices[2]):
        assert isinstance(failed, PredictionException) and failed.error_code == 400
        assert str(failed.message) == BANNED_ALL
    assert not isinstance(choices[1], Exception) and choices[3] == (2, None)


def test_a_sampler_that_fails_fails_its_row_alone(monkeypatch):
    from handlers.generation.params import SamplingParams
    from handlers.generation.sampling import Sampler, choose_tokens

    broken = Sampler(SamplingParams(temperature=1.0, seed=1, repetition_penalty=1.2), [], [1])
    monkeypatch.setattr(broken, "choose", lambda row: (_ for _ in ()).throw(ValueError("bad")))
    drawn = Sampler(SamplingParams(temperature=1.0, seed=1), [], [1])
    rows = [Sampler(SamplingParams(temperature=0), [], [1]), broken, drawn]
    logits = torch.tensor([[0.0, 1.0, 3.0], [1.0, 0.0, 0.0], [0.0, 9.0, 0.0]])
    choices = choose_tokens(rows, logits.clone())
    assert choices[0] == (2, None) and isinstance(choices[1], ValueError)
    assert not isinstance(choices[2], Exception)
    from handlers.generation import sampling

    def fails(*args: object) -> None:
        raise RuntimeError("the rows sampled together failed")

    monkeypatch.setattr(sampling, "sample_rows", fails)  # every sampled row of the step fails
    choices = choose_tokens(rows, logits.clone())
    assert choices[0] == (2, None) and isinstance(choices[2], RuntimeError)
