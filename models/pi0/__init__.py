"""Pi0 policy family (model.name: pi0)."""
