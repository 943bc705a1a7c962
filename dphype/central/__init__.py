"""Central (trusted-curator) private hyperparameter tuning, for comparison with federated DP-Hype.

* `dphype.central.dpareto` - DPareto privacy-utility Pareto fronts (Avent et al. 2020).
* `dphype.central.dpbo` - differentially private Bayesian optimisation (Kusner et al. 2015).
* `dphype.central.propose_test` - propose-test tuning with doubling step (Ding & Wu 2022).
* `dphype.central.compare` - DP-Hype vs the central methods on one task and budget.

All central methods need a trusted curator holding the whole data set; DP-Hype does not.
"""
