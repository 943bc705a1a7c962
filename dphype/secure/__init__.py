"""Secure computation, framework-free.

DP-Hype's SecAgg+ with its consistency round and node-side checks (`dphype.secure.secagg`), its primitives from
``cryptography`` (`dphype.secure.relay`), Shamir sharing, Bell et al.'s secure SecAgg+ parameters and the secure
sum's encoding and ranges.
"""
