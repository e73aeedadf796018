"""Simulator adapters behind the batched env protocol; each subpackage registers one env name."""
