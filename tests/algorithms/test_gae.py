"""GAE, advantage normalisation and explained variance vs hand-worked values."""

import math
import threading

import pytest
import torch

from embodied_async.algorithms import compute_gae, explained_variance, normalize_advantages


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


def test_gae_done_in_middle():
    # gamma=0.9, lambda=0.8 -> gamma*lambda = 0.72.
    # Column 0: r=[1,2,3], V=[0.5,1,1.5], done=[F,T,F], V_T=2
    #   t=2: delta = 3 + 0.9*2 - 1.5 = 3.3            A2 = 3.3
    #   t=1: done -> delta = 2 + 0 - 1 = 1.0          A1 = 1.0 (recursion cut)
    #   t=0: delta = 1 + 0.9*1 - 0.5 = 1.4            A0 = 1.4 + 0.72*1.0 = 2.12
    #   returns = A + V = [2.62, 2.0, 4.8]
    # Column 1: r=[0,0,1], V=[1,1,1], no dones, V_T=0
    #   t=2: delta = 1 + 0 - 1 = 0                    A2 = 0
    #   t=1: delta = 0 + 0.9 - 1 = -0.1               A1 = -0.1
    #   t=0: delta = -0.1                             A0 = -0.1 + 0.72*-0.1 = -0.172
    #   returns = [0.828, 0.9, 1.0]
    rewards = t([[1, 0], [2, 0], [3, 1]])
    values = t([[0.5, 1], [1.0, 1], [1.5, 1]])
    dones = torch.tensor([[False, False], [True, False], [False, False]])
    adv, ret = compute_gae(rewards, values, dones, t([2.0, 0.0]), torch.zeros(3, 2), 0.9, 0.8)
    assert adv.shape == (3, 2) and adv.dtype == torch.float32
    torch.testing.assert_close(adv, t([[2.12, -0.172], [1.0, -0.1], [3.3, 0.0]]))
    torch.testing.assert_close(ret, t([[2.62, 0.828], [2.0, 0.9], [4.8, 1.0]]))


def test_gae_truncation_bootstrap():
    # gamma=0.5, lambda=0.5 -> 0.25. r=[1,1,1], V=[2,4,8], done=[F,T,F],
    # episode truncated at t=1 with V(final obs)=6, V_T=10.
    #   t=2: delta = 1 + 0.5*10 - 8 = -2                 A2 = -2
    #   t=1: delta = 1 + 0.5*(8*0 + 6) - 4 = 0           A1 = 0
    #   t=0: delta = 1 + 0.5*4 - 2 = 1                   A0 = 1 + 0.25*0 = 1
    # Without the bootstrap (true terminal): delta1 = 1 - 4 = -3, A0 = 1 - 0.75 = 0.25
    rewards = t([[1.0], [1.0], [1.0]])
    values = t([[2.0], [4.0], [8.0]])
    dones = torch.tensor([[False], [True], [False]])
    boot = t([[0.0], [6.0], [0.0]])
    adv, ret = compute_gae(rewards, values, dones, t([10.0]), boot, 0.5, 0.5)
    torch.testing.assert_close(adv, t([[1.0], [0.0], [-2.0]]))
    torch.testing.assert_close(ret, t([[3.0], [4.0], [6.0]]))

    adv0, _ = compute_gae(rewards, values, dones, t([10.0]), torch.zeros(3, 1), 0.5, 0.5)
    torch.testing.assert_close(adv0, t([[0.25], [-3.0], [-2.0]]))


def test_gae_lambda1_gamma1_returns_are_reward_sums():
    # lambda=1, gamma=1: returns are undiscounted reward-to-go (+ V_T if no done),
    # independent of the values.
    # Column 0: r=[1,2,3], no dones, V_T=4 -> returns [10, 9, 7]
    # Column 1: r=[1,1,1], done at t=0, V_T=0 -> returns [1, 2, 1]
    rewards = t([[1, 1], [2, 1], [3, 1]])
    values = t([[5, 3], [-1, 3], [0.5, 3]])
    dones = torch.tensor([[False, True], [False, False], [False, False]])
    adv, ret = compute_gae(rewards, values, dones, t([4.0, 0.0]), torch.zeros(3, 2), 1.0, 1.0)
    torch.testing.assert_close(ret, t([[10, 1], [9, 2], [7, 1]]))
    torch.testing.assert_close(adv, t([[5, -2], [10, -1], [6.5, -2]]))


def test_gae_lambda1_discounted_returns():
    # gamma=0.5, lambda=1: r=[1,2,4], V_T=8 -> R2 = 4 + 4 = 8, R1 = 2 + 4 = 6, R0 = 1 + 3 = 4
    rewards = t([[1.0], [2.0], [4.0]])
    values = t([[1.0], [1.0], [1.0]], requires_grad=True)
    adv, ret = compute_gae(
        rewards, values, torch.zeros(3, 1, dtype=torch.bool), t([8.0]), torch.zeros(3, 1), 0.5, 1.0
    )
    torch.testing.assert_close(ret, t([[4.0], [6.0], [8.0]]))
    assert not ret.requires_grad and not adv.requires_grad


def test_gae_lambda0_is_one_step_td():
    # lambda=0: A_t = delta_t. r=[1,1], V=[1,2], V_T=3, gamma=0.5
    #   delta1 = 1 + 1.5 - 2 = 0.5 ; delta0 = 1 + 1 - 1 = 1
    adv, _ = compute_gae(
        t([[1.0], [1.0]]), t([[1.0], [2.0]]), torch.zeros(2, 1, dtype=torch.bool),
        t([3.0]), torch.zeros(2, 1), 0.5, 0.0,
    )
    torch.testing.assert_close(adv, t([[1.0], [0.5]]))


def test_normalize_advantages_mask():
    # Masked entries [1,2,3]: mean 2, population var (1+0+1)/3 = 2/3, std 0.8164966
    # -> [-1/0.8165, 0, 1/0.8165] = [-1.2247449, 0, 1.2247449]; the masked 100 -> 0.
    adv = t([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([True, True, True, False])
    out = normalize_advantages(adv, mask)
    torch.testing.assert_close(out, t([-1.2247449, 0.0, 1.2247449, 0.0]))


def test_normalize_advantages_no_mask():
    # [0, 4]: mean 2, std 2 -> [-1, 1]
    torch.testing.assert_close(normalize_advantages(t([0.0, 4.0])), t([-1.0, 1.0]))


def test_normalize_advantages_two_ranks_match_single_rank():
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(8, 6, generator=gen) * 3 + 1
    mask = torch.rand(8, 6, generator=gen) > 0.3
    expected = normalize_advantages(adv, mask)

    # Simulate 2 data-parallel ranks as threads: each deposits its local stats,
    # waits for the other, and gets back the elementwise sum (an all-reduce).
    barrier = threading.Barrier(2)
    slots = [None, None]
    results = [None, None]

    def run_rank(rank):
        def all_reduce(x):
            slots[rank] = x.clone()
            barrier.wait()
            return slots[0] + slots[1]

        rows = slice(0, 4) if rank == 0 else slice(4, 8)
        results[rank] = normalize_advantages(adv[rows], mask[rows], all_reduce=all_reduce)

    threads = [threading.Thread(target=run_rank, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    torch.testing.assert_close(torch.cat(results), expected)
    # Each half alone would use different (local) statistics.
    assert not torch.allclose(normalize_advantages(adv[:4], mask[:4]), expected[:4])


def test_explained_variance():
    returns = t([1.0, 2.0, 3.0])
    assert explained_variance(returns, returns) == pytest.approx(1.0)
    assert explained_variance(t([2.0, 2.0, 2.0]), returns) == pytest.approx(0.0)
    # diff = [0, 0, -1]: var = 1/3 - 1/9 = 2/9 ; Var(returns) = 2/3 -> 1 - 1/3
    assert explained_variance(t([1.0, 2.0, 4.0]), returns) == pytest.approx(2 / 3)
    assert math.isnan(explained_variance(t([1.0, 2.0]), t([5.0, 5.0])))


def test_explained_variance_mask():
    # The masked-out last entry would otherwise ruin the fit.
    values = t([1.0, 2.0, 4.0, 50.0])
    returns = t([1.0, 2.0, 3.0, -50.0])
    mask = torch.tensor([True, True, True, False])
    assert explained_variance(values, returns, mask) == pytest.approx(2 / 3)
