"""The stochastic denoising transitions: their densities are normalised Gaussians with the stated
means and stds, and they reduce to the Euler step where they should."""

import math

import pytest
import torch

from models.pi0.flow_sampling import (bounded_std, euler_mean, gaussian_log_prob, sde_sigma, sde_transition)


def test_sde_transition_matches_its_formula_and_the_euler_step_without_noise():
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(4, 5, 7, generator=gen), torch.randn(4, 5, 7, generator=gen)
    t, step, level = 0.7, 0.1, 0.5
    mean, std = sde_transition(x, v, t, step, level)
    sigma = level * math.sqrt(0.7 / 0.3)
    torch.testing.assert_close(mean, x - step * (v + sigma ** 2 / 1.4 * (x + 0.3 * v)))
    assert std == pytest.approx(math.sqrt(step) * sigma)
    zero_mean, zero_std = sde_transition(x, v, t, step, 0.0)
    torch.testing.assert_close(zero_mean, euler_mean(x, v, step))
    assert zero_std == 0.0


def test_sde_sigma_is_finite_at_the_first_step():
    assert sde_sigma(1.0, 0.25, 0.5) == pytest.approx(0.5 * math.sqrt(1.0 / 0.25))  # t clipped to 1 - step
    assert sde_sigma(0.5, 0.25, 0.5) == pytest.approx(0.5)


def test_gaussian_density_is_normalised_and_draws_match_it():
    """Monte Carlo: draws of mean + std * eps have the analytic mean and std, and the density
    integrates to 1 (on a fine grid) for the stds the samplers use."""
    gen = torch.Generator().manual_seed(1)
    x, v = torch.randn(1, generator=gen), torch.randn(1, generator=gen)
    mean, std = sde_transition(x, v, 0.6, 0.2, 0.5)
    draws = mean + std * torch.randn(200_000, generator=gen, dtype=torch.float64)
    assert float(draws.mean()) == pytest.approx(float(mean), abs=4 * std / math.sqrt(200_000))
    assert float(draws.std()) == pytest.approx(std, rel=0.01)
    for s in (std, 0.08, 0.16):
        grid = torch.linspace(float(mean) - 12 * s, float(mean) + 12 * s, 200_001, dtype=torch.float64)
        density = gaussian_log_prob(grid, mean.double(), s).exp()
        assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-6)
    # and the log-density of the draws averages to the analytic negative entropy
    entropy = 0.5 * math.log(2 * math.pi * math.e * std ** 2)
    assert float(gaussian_log_prob(draws, mean.double(), std).mean()) == pytest.approx(-entropy, abs=0.01)


def test_bounded_std_stays_within_bounds_and_spans_them():
    raw = torch.linspace(-20, 20, 101)
    std = bounded_std(raw, 0.08, 0.16)
    assert float(std.min()) == pytest.approx(0.08, rel=1e-4) and float(std.max()) == pytest.approx(0.16, rel=1e-4)
    assert bool((std[1:] >= std[:-1]).all())  # monotone in the head's output
