"""The argmax release's noise, sampled jointly inside the MPC (`dphype.privacy.winner.JointSampler`,
`dphype.secure.tally_party.sample_discrete_laplace`): the sampler's construction against the exact law at 80
digits, the MPC's comparisons against their plain definition on fixed bits, and real draws against the law."""

import json
import math
import subprocess
import sys
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

import dphype.secure.tally_party as tally_party
from dphype.privacy.winner import (
    SAMPLER_TV,
    JointSampler,
    discrete_laplace_pmf,
    noise_parameter,
    sampler_delta,
)

PARTY_DIR = Path(tally_party.__file__).parent

# runs sample_discrete_laplace in one MPyC party (its own process: MPyC reads the command line on import); with
# "bits" given, MPyC's secure random bits are replaced by those
SCRIPT = """
import json, sys
job = json.loads(sys.stdin.readline())
sys.argv = [sys.argv[0], "-M1", "--no-log"]
sys.path.insert(0, job["dir"])
import numpy as np
from mpyc.runtime import mpc
import tally_party

async def main():
    await mpc.start()
    secint = mpc.SecInt(32)
    if job.get("bits") is not None:
        fixed = np.array(job["bits"], dtype=object)
        mpc.np_random_bits = lambda sectype, n: sectype.array(sectype.field.array(fixed[:n]))
    out = await mpc.output(tally_party.sample_discrete_laplace(mpc, secint, job["sampler"]))
    await mpc.shutdown()
    print(json.dumps([int(v) for v in out]))

mpc.run(main())
"""


def run_sampler(sampler, bits=None):
    job = {"dir": str(PARTY_DIR), "sampler": sampler.to_dict(), "bits": bits}
    done = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(job) + "\n", capture_output=True,
                          text=True, timeout=120, check=True)
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(("epsilon", "neighbouring", "g", "p"),
                         [(1.0, "replace-one", 1, 100), (0.3, "add-remove", 1, 12), (0.5, "replace-one", 15, 1000)])
def test_every_threshold_is_within_2_to_the_minus_precision_and_the_whole_vector_within_sampler_tv(
        epsilon, neighbouring, g, p):
    s = JointSampler.for_release(p, epsilon, neighbouring, g)
    shift = {"replace-one": 2, "add-remove": 1}[neighbouring] * g
    with localcontext() as ctx:
        ctx.prec = 80
        for i, c in enumerate(s.thresholds):  # q_i = t^(2^i) / (1 + t^(2^i)), independently at 80 digits
            a = (-Decimal(epsilon) / shift * 2**i).exp()
            assert abs(Decimal(c) / Decimal(2) ** s.precision - a / (1 + a)) <= Decimal(2) ** -(s.precision + 1)
        tail = 2 * (-Decimal(epsilon) / shift * 2**s.digits).exp()
    assert s.total_variation <= SAMPLER_TV
    assert 2 * p * (s.digits * 2.0**-s.precision + float(tail)) <= SAMPLER_TV
    assert s.t == noise_parameter(epsilon, neighbouring, g)


def test_the_digits_law_is_the_discrete_laplace():
    # a factorisation error (a wrong q_i, digits not independent) would move these by far more than 1e-12
    for eps in (0.2, 1.0, 3.0):
        s = JointSampler.for_release(10, eps, "replace-one")
        z = np.arange(-(2**s.digits) - 3, 2**s.digits + 3)
        assert np.max(np.abs(s.pmf(z) - discrete_laplace_pmf(z, s.t))) < 1e-12
        assert s.pmf(z).sum() == pytest.approx(1.0, abs=1e-12)


def test_a_sampler_too_fine_for_the_secure_integers_is_refused_naming_epsilon_before_any_client_works():
    from dphype.config import DPHypeConfig
    from dphype.protocol import make_vote_request
    from dphype.selection.candidates import candidate_grid

    with pytest.raises(ValueError, match="epsilon must be at least"):
        JointSampler.for_release(100, 1e-7, "replace-one", 15)
    config = DPHypeConfig(epsilon=1e-8, delta=1e-5, k=1, clients=10, release="argmax")
    with pytest.raises(ValueError, match=r"epsilon must be at least 3.\d+e-07 .* got 1e-08; raise epsilon"):
        make_vote_request(config, candidate_grid(lr=[0.1, 1.0]), tallies=tuple(bytes([j + 1]) * 32 for j in range(3)))


def test_sampler_delta_is_the_total_variation_bound_times_one_plus_e_to_the_epsilon():
    assert sampler_delta(1.0) == pytest.approx((1 + math.e) * SAMPLER_TV)
    assert sampler_delta(1.0, 0) == 0.0 and sampler_delta(2.0, 3) == pytest.approx(3 * (1 + math.e**2) * SAMPLER_TV)
    assert sampler_delta(1e4) == math.inf


def test_the_mpc_draws_each_digit_as_its_uniform_below_its_threshold():
    s = JointSampler.for_release(3, 1.0, "replace-one")
    rng = np.random.default_rng(5)
    count = 2 * s.size * s.digits
    bits = rng.integers(0, 2, size=s.precision * count)
    # the party reads bit j of uniform d at j * count + d; make some uniforms equal to a threshold (not below it)
    # and some one below it: the comparison's edges
    grid = bits.reshape(s.precision, count)
    for d, c in ((0, s.thresholds[0]), (1, s.thresholds[1] - 1)):
        grid[:, d] = [(c >> j) & 1 for j in range(s.precision)]
    u = [sum(int(grid[j, d]) << j for j in range(s.precision)) for d in range(count)]
    digits = np.array([int(u[d] < s.thresholds[d % s.digits]) for d in range(count)]).reshape(2 * s.size, s.digits)
    geometric = digits @ (1 << np.arange(s.digits))
    expected = geometric[:s.size] - geometric[s.size:]
    assert digits[0, 0] == 0 and digits[0, 1] == 1
    assert run_sampler(s, bits=grid.reshape(-1).tolist()).tolist() == expected.tolist()


def test_the_mpcs_own_random_draws_follow_the_discrete_laplace():
    """1,000 draws of one party (MPyC's secure random bits): a chi-square fit to the law, which rejects a 40% scale
    error in the same test."""
    s = JointSampler.for_release(1000, 1.0, "replace-one")
    draws = run_sampler(s)

    def p_value(t):
        lim = 6
        pmf = discrete_laplace_pmf(np.arange(-lim, lim + 1), t)
        pmf[0] = pmf[-1] = t**lim / (1 + t)
        observed = np.bincount(np.clip(draws, -lim, lim) + lim, minlength=2 * lim + 1)
        return chi2.sf(float(np.sum((observed - draws.size * pmf) ** 2 / (draws.size * pmf))), 2 * lim)

    assert p_value(s.t) > 1e-4
    assert p_value(math.exp(-1.0 / 2.8)) < 1e-4 and p_value(math.exp(-1.0 / 1.2)) < 1e-4


def test_three_tallies_sample_the_noise_together_and_refuse_to_compute_on_different_samplers():
    """Through the committee (3 MPyC parties on loopback): with the sampler for epsilon 16 (t = e^-8) a lead of 2
    votes wins (but with probability about 1e-6); a tally handed another epsilon's sampler makes the parties
    disagree before anything is computed."""
    from dphype.secure.committee import (
        OPENS_ARGMAX,
        Opening,
        Tally,
        TallyError,
        client_sealed_shares,
        run_loopback_committee,
        voter_id,
    )
    from dphype.selection.ballots import BallotForm

    def run(epsilons):
        tallies = [Tally(j) for j in range(3)]
        for t, eps in zip(tallies, epsilons, strict=True):
            t.open_round("req-j", 6, 3, form=BallotForm.top_k(1),
                         noise=JointSampler.for_release(6, eps, "replace-one"), opens=OPENS_ARGMAX)
        for c, winner in enumerate((4, 4, 4, 1)):
            ballot = np.zeros(6, dtype=np.int64)
            ballot[winner] = 1
            sealed = client_sealed_shares("req-j", ballot, [t.public for t in tallies], voter_id(0, f"c{c}"))
            for t, share in zip(tallies, sealed, strict=True):
                t.receive(f"c{c}", share)
        return run_loopback_committee([t.job() for t in tallies])

    assert run((16.0, 16.0, 16.0)) == Opening(4, ())
    with pytest.raises(TallyError, match="tallies disagree on the noise sampler"):
        run((16.0, 16.0, 1.0))


def test_the_mpc_draws_the_top_digit_so_its_noise_reaches_the_samplers_whole_range():
    """The law's upper tail, at its boundary: the top digit ``L - 1`` carries ``2^(L - 1)``, and without it the
    committee's noise would stop at ``2^(L - 1) - 1`` (a total variation to the exact law of about ``2 p t^(2^(L-1))``,
    far above `SAMPLER_TV`). With fixed secure random bits the MPC must draw every digit of every geometric: all digits
    1 against all 0 gives ``2^L - 1``, the top digit alone (its uniform one below its threshold, every other uniform
    equal to its threshold, so not below) gives ``2^(L - 1)``, and the reverse gives ``-(2^L - 1)``."""
    s = JointSampler.for_release(3, 1.0, "replace-one")
    top = s.digits - 1
    assert s.thresholds[top] >= 1 and s.pmf(2**s.digits - 1) > 0  # the top digit can be 1: the law reaches 2^L - 1
    lowest, highest = 0, 2**s.precision - 1  # below every threshold; below none
    uniforms = np.full((2 * s.size, s.digits), highest, dtype=object)  # geometric g's digit i: uniform g * L + i
    uniforms[0, :] = lowest  # candidate 0: all digits 1, minus 0
    uniforms[1, :] = s.thresholds  # candidate 1: equal to each threshold (digit 0) ...
    uniforms[1, top] = s.thresholds[top] - 1  # ... but the top digit's, one below it (digit 1)
    uniforms[s.size + 2, :] = lowest  # candidate 2: 0 minus all digits 1
    flat = uniforms.reshape(-1)
    bits = [(int(u) >> j) & 1 for j in range(s.precision) for u in flat]  # bit j of uniform d at j * count + d
    drawn = run_sampler(s, bits=bits).tolist()
    assert drawn == [2**s.digits - 1, 2**top, -(2**s.digits - 1)], (
        f"the MPC's draws {drawn} miss the sampler's top digit {top} (expected {2**s.digits - 1}, {2**top}, "
        f"{-(2**s.digits - 1)})")
