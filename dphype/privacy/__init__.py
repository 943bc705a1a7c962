"""Privacy: what a release is and what it costs.

* `dphype.privacy.accounting` -- the release description (`dphype.privacy.accounting.VoteEvent`), exact calibration,
  epsilon/delta for Gaussian and Skellam noise (RDP and analytic), the run accountant's RDP curves.
* `dphype.privacy.noise` -- each client's integer or Gaussian noise share, from a CSPRNG, and the seeded replay of
  a noisy sum (`dphype.privacy.noise.replay_noisy_sums`, for benchmarks and the planner).
* `dphype.privacy.noise_kinds` -- one class per noise kind (Gaussian, Skellam; the winner's discrete Laplace registers
  in `dphype.privacy.winner`): sampling, tail and accountants.
* `dphype.privacy.audit` -- an empirical lower bound on epsilon for the noise path.
* `dphype.privacy.winner` -- the winner-only release (``release="argmax"``): report-noisy-max with
  committee-made discrete Laplace noise, its proof sketch, pure-DP report, Renyi curve and seeded replay.
"""
