"""Secure computation, framework-free: SecAgg+ (`dphype.secure.secagg`), the tally committee, their primitives."""
