"""The activations a family's MLPs offer: the config's name for each and its ``torch.nn`` class.
Without torch, so a family's config checks ``model.activation`` against it at start-up."""

ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU", "gelu": "GELU"}
