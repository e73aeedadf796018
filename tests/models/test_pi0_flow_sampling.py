"""The stochastic denoising transitions: their densities are normalised Gaussians with the stated
means and stds, and they reduce to the Euler step where they should."""

import math

import pytest
import torch

from models.pi0.flow_sampling import bounded_std, euler_mean, gaussian_log_prob, sde_sigma, sde_transition


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


class GaussianFlow:
    """A stand-in for Pi0Model.run_suffix: the exact velocity of the flow from N(0, 1) noise to
    N(mu, s^2) data (x_t = t * noise + (1 - t) * a), whose marginals are known."""

    def __init__(self, mu: float, s: float):
        self.mu, self.s = mu, s

    def run_suffix(self, cache, pad, state, x, time):
        t = time.reshape(-1, 1, 1).to(x.dtype)
        gain = (t - (1 - t) * self.s ** 2) / (t ** 2 + (1 - t) ** 2 * self.s ** 2)
        velocity = -self.mu + gain * (x - (1 - t) * self.mu)
        return velocity, torch.zeros(x.shape[0], x.shape[1], 4)


def test_sde_steps_drawn_by_the_sampler_keep_the_flow_marginals():
    """Through sample_chain itself: with the exact velocity, chains with one SDE step per sample
    end where the deterministic ones do (N(mu, s^2)); a wrong drift correction would not."""
    from models.pi0.chain import ChainSettings, sample_chain

    flow, gen = GaussianFlow(mu=0.7, s=0.4), torch.Generator().manual_seed(5)
    noise = torch.randn(40_000, 1, 1, generator=gen)
    ends = {}
    for method in ("flow_ode", "flow_sde"):
        cfg = ChainSettings(method, steps=20, executed_actions=1, action_dim=1, noise_level=1.0)
        out = sample_chain(flow, (None, None), None, noise, cfg, generator=gen)
        ends[method] = out["actions"].flatten()
        if method == "flow_sde":  # each sample's stochastic step was a Gaussian of the stated std
            rows = torch.arange(noise.shape[0])
            k = out["stochastic_step"]
            x_k, x_next = out["chain"][rows, k], out["chain"][rows, k + 1]
            t = torch.tensor([1.0 - i / 20 for i in range(20)])[k]
            mean, std = sde_transition(x_k, flow.run_suffix(None, None, None, x_k, t)[0], t, 1 / 20, 1.0)
            z = ((x_next - mean) / std).flatten()
            assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02
    ode, sde = ends["flow_ode"], ends["flow_sde"]
    assert float(ode.mean()) == pytest.approx(0.7, abs=0.01) and float(ode.std()) == pytest.approx(0.4, rel=0.1)
    # the same marginal as the deterministic chain (Euler's own error is common to both)
    assert float(sde.mean()) == pytest.approx(float(ode.mean()), abs=0.01)
    assert float(sde.std()) == pytest.approx(float(ode.std()), rel=0.03)
