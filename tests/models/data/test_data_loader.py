"""Training windows: content, seeded order, rank split and resumability."""

import numpy as np
import pytest
import torch

from deltamatch.models.data.loader import SampleOrder, TokenWindows, TrainBatches, val_batches
from deltamatch.models.data.shards import ShardWriter, write_manifest


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 1000, size=rng.integers(5, 60)).tolist() for _ in range(80)]
    writers = {s: ShardWriter(tmp_path / s, np.dtype("<u2"), eos_id=1, shard_tokens=300) for s in ("train", "val")}
    for i, d in enumerate(docs):
        writers["val" if i % 10 == 0 else "train"].add(d)
    write_manifest(tmp_path, vocab_size=1000, special={"eos": 1}, seed=0, source={}, splits=writers)
    stream = np.concatenate([np.array(d + [1]) for i, d in enumerate(docs) if i % 10])
    return tmp_path, stream


def test_windows_are_shard_slices_that_never_straddle(shards):
    folder, stream = shards
    w = TokenWindows(folder, "train", seq_len=16)
    assert len(w) == sum(len(s) // 16 for s in w.shards)
    # shards hold 300 tokens: 18 windows each, the 12-token tails dropped
    np.testing.assert_array_equal(w.window(0), stream[:16])
    np.testing.assert_array_equal(w.window(18), stream[300:316])
    assert w.batch([3, 18]).shape == (2, 16) and w.batch([3]).dtype == torch.int64
    with pytest.raises(ValueError, match="seq_len"):
        TokenWindows(folder, "train", seq_len=10_000)


def test_order_is_a_seeded_permutation_per_epoch():
    order = SampleOrder(50, seed=7)
    first, second = [order[i] for i in range(50)], [order[i] for i in range(50, 100)]
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second and first != list(range(50))
    assert [SampleOrder(50, seed=7)[i] for i in range(50)] == first
    assert [SampleOrder(50, seed=8)[i] for i in range(50)] != first


def test_ranks_partition_each_step_and_any_step_rebuilds_alone(shards):
    folder, _ = shards
    w = TokenWindows(folder, "train", seq_len=8)
    single = TrainBatches(w, seed=1, micro_batch=2, grad_accum=2, rank=0, world=1)
    ranks = [TrainBatches(w, seed=1, micro_batch=1, grad_accum=2, rank=r, world=2) for r in range(2)]
    for step in (0, 5, 3):  # out of order: the position is the step number, nothing else
        whole = torch.cat(single.step(step))
        parts = torch.cat([b for r in ranks for b in r.step(step)])
        assert sorted(map(tuple, whole.tolist())) == sorted(map(tuple, parts.tolist()))
    again = TrainBatches(w, seed=1, micro_batch=2, grad_accum=2, rank=0, world=1)
    assert all(torch.equal(a, b) for a, b in zip(again.step(5), single.step(5)))


def test_val_batches_give_every_rank_the_same_count(shards):
    folder, _ = shards
    w = TokenWindows(folder, "val", seq_len=8)
    per_rank = [val_batches(w, micro_batch=4, batches=100, rank=r, world=3) for r in range(3)]
    assert len({len(b) for b in per_rank}) == 1
    seen = torch.cat([torch.cat(b) for b in per_rank])
    assert len({tuple(x) for x in seen.tolist()}) == len(seen)  # disjoint while the split is large enough
    tiny = [val_batches(w, micro_batch=len(w), batches=2, rank=r, world=2) for r in range(2)]
    assert [len(b) for b in tiny] == [1, 1]


def test_a_missing_or_short_shard_is_a_clear_error(shards):
    folder, _ = shards
    victim = sorted((folder / "train").glob("*.bin"))[1]
    victim.write_bytes(victim.read_bytes()[:-2])
    with pytest.raises(ValueError, match="wrong size"):
        TokenWindows(folder, "train", seq_len=8)
    victim.unlink()
    with pytest.raises(ValueError, match="missing"):
        TokenWindows(folder, "train", seq_len=8)
