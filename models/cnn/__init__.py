"""Image + state CNN actor-critic (Gaussian actions): ``configuration_cnn`` holds its config,
``modeling_cnn`` the network (imported only where a policy is built)."""
