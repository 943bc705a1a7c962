"""Machine learning for DP-Hype's clients and benchmarks.

Tasks (data + model + "score these candidates"), the batched torch training engine, bundled data sets, models,
and the shared privacy and utility oracles.
"""
