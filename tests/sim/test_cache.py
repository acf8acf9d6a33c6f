"""Cache semantics: longest leading run, LRU with tail-first eviction, refresh on hit, NIC fair share."""

from __future__ import annotations

import pytest

from tandem_lab.sim.cache import NicModel, PrefixCache, hit_tokens


@pytest.mark.parametrize(
    ("present", "prompt", "want_run"),
    [
        pytest.param([1, 2, 3], [1, 2, 3, 4], 3, id="prefix hit"),
        pytest.param([1, 3, 4], [1, 2, 3, 4], 1, id="a hole stops the run"),
        pytest.param([2, 3], [1, 2, 3], 0, id="missing head means no hit"),
        pytest.param([], [1], 0, id="empty cache"),
    ],
)
def test_leading_run_is_the_longest_present_prefix(present: list[int], prompt: list[int], want_run: int) -> None:
    for capacity in (None, 100):
        cache = PrefixCache(capacity)
        cache.insert(present)
        assert cache.leading_run(prompt) == want_run
        assert cache.lookup(prompt) == want_run


def test_insert_evicts_tail_first_so_heads_survive() -> None:
    cache = PrefixCache(4)
    cache.insert([1, 2, 3, 4])  # inserted tail first: 1 is the most recent
    cache.insert([9])  # evicts the least recent: block 4 (a tail), not block 1 (a head)
    assert 4 not in cache and 1 in cache
    assert cache.leading_run([1, 2, 3, 4]) == 3
    assert cache.evictions == 1


def test_reinserting_a_hit_refreshes_recency() -> None:
    cache = PrefixCache(3)
    cache.insert([1, 2])
    cache.insert([7])  # order (oldest first): 2, 1, 7
    assert cache.lookup([1, 2]) == 2
    cache.insert([1, 2])  # after the prefill: refresh 2 then 1 → order 7, 2, 1
    cache.insert([8])  # evicts 7
    assert 7 not in cache and 1 in cache and 2 in cache


def test_fast_leading_run_equals_linear_scan_on_chained_prompts() -> None:
    import random  # noqa: PLC0415

    rnd = random.Random(4)
    cache = PrefixCache(400)
    chains = [[c * 10_000 + i for i in range(rnd.randint(1, 300))] for c in range(60)]
    for _ in range(2_000):
        chain = rnd.choice(chains)
        prompt = chain[: rnd.randint(1, len(chain))]
        assert cache.leading_run(prompt) == cache.leading_run_exact(prompt)
        cache.insert(prompt)


def test_infinite_cache_never_evicts() -> None:
    cache = PrefixCache(None)
    cache.insert(list(range(10_000)))
    assert len(cache) == 10_000 and cache.evictions == 0


@pytest.mark.parametrize(
    ("run", "n_blocks", "input_tokens", "want"),
    [
        pytest.param(2, 4, 1800, 1024, id="partial hit counts full blocks"),
        pytest.param(4, 4, 1800, 1800, id="full hit counts the partial last block"),
        pytest.param(0, 4, 1800, 0, id="miss"),
    ],
)
def test_hit_tokens_are_token_weighted(run: int, n_blocks: int, input_tokens: int, want: int) -> None:
    assert hit_tokens(run, n_blocks, input_tokens, 512) == want


def test_nic_transfers_share_reader_and_store_bandwidth() -> None:
    nic = NicModel(nic_bandwidth=50e9, store_bandwidth=100e9)
    assert nic.transfer(0, 50e9, now=0.0) == pytest.approx(1.0)  # alone: the reader's NIC is the limit
    assert nic.transfer(0, 50e9, now=0.0) == pytest.approx(2.0)  # second on the same reader: half its NIC
    assert nic.transfer(1, 100e9, now=0.0) == pytest.approx(3.0)  # third overall: stores give 100/3 GB/s
    assert nic.transfer(1, 50e9, now=10.0) == pytest.approx(1.0)  # earlier transfers are over
    assert nic.bytes_moved == pytest.approx(250e9)
