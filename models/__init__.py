"""Policies behind one protocol (predict / evaluate / value), registered by name."""
