"""Flower adapters of dphype (everything here imports Flower; the math and protocol modules do not)."""
