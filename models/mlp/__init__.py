"""State-based MLP actor-critic (Gaussian actions): ``configuration_mlp`` holds its config,
``modeling_mlp`` the network (imported only where a policy is built)."""
