"""Secure computation, framework-free: the secure sum's encoding and ranges, Shamir sharing,
Bell et al.'s secure SecAgg+ parameters and the node-side checks of the protocol's stages.
"""
