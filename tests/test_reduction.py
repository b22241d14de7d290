"""Gradient reduction in buckets (engine/distributed.py) on two gloo processes: the same sums as one
call per tensor, in two or three calls; "no gradient on any rank" stays None."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.distributed import Dist, _buckets


def params_of(rank: int) -> list[torch.nn.Parameter]:
    """Five tensors: grads on both ranks, on rank 0 only, on none, and two more on both."""
    gen = torch.Generator().manual_seed(rank)
    shapes = [(3, 4), (5,), (2, 2), (7, 3), (1,)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for i, p in enumerate(params):
        if i == 2 or (i == 1 and rank == 1):
            continue
        p.grad = torch.randn(p.shape, generator=gen)
    return params


def worker(rank: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        d = Dist(rank=rank, world_size=2)
        per_tensor, bucketed = params_of(rank), params_of(rank)
        calls = (d.average_gradients(per_tensor, denominator=2, bucket_bytes=0),
                 d.average_gradients(bucketed, denominator=2))
        out[rank] = ([None if p.grad is None else p.grad.tolist() for p in per_tensor],
                     [None if p.grad is None else p.grad.tolist() for p in bucketed], calls)
    finally:
        dist.destroy_process_group()


def test_buckets_sum_like_one_call_per_tensor_and_keep_none(tmp_path):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(str(tmp_path / "init"), out), nprocs=2, join=True)
        results = dict(out)
    expected = []
    for a, b in zip(params_of(0), params_of(1)):
        grads = [p.grad for p in (a, b) if p.grad is not None]
        expected.append(sum(grads, torch.zeros(a.shape)) / 2 if grads else None)
    for rank in (0, 1):
        per_tensor, bucketed, calls = results[rank]
        assert calls == (1 + 4, 1 + 1)  # the mask, then 4 tensors one by one / one bucket
        assert bucketed[2] is None and per_tensor[2] is None
        for want, a, b in zip(expected, per_tensor, bucketed):
            if want is not None:
                assert torch.equal(torch.tensor(a), want) and torch.equal(torch.tensor(b), want)


def test_buckets_respect_size_and_dtype():
    grads = [torch.zeros(256), torch.zeros(256), torch.zeros(256, dtype=torch.float64), torch.zeros(512)]
    assert [len(b) for b in _buckets(grads, 2048)] == [2, 1, 1]  # 1 KiB each; a new dtype starts a bucket
    assert [len(b) for b in _buckets(grads, 0)] == [1, 1, 1, 1]
