"""Noise, slack and integrity mutations: plant each fault (wrong noise, slack, over-spends, silently dropped
checks) in a temporary copy of the repository and run the test files that should catch it; print, per
mutation, which test files fail (catch it) and which pass.

    python -m simulations.mutations                    # every mutation against every test file below
    python -m simulations.mutations --only halve-share --files tests/flower/test_vote_noise.py
    python -m simulations.mutations --targeted         # each mutation against the tests named to catch it

With ``--targeted`` each mutation runs only the tests it names (``Mutation.tests``, pytest node ids: the tests
written to catch that slip), and the report names each test that fails under it.

The copy holds the repository's tracked and untracked, not ignored, files; its tests import the copy's
``dphype`` (checked before any mutation runs), never the installed one. The unmutated copy runs first and must
pass, so a failure under a mutation is the mutation's doing. Not a test: it runs the test files many times
(minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...] = ()  # the tests written to catch it (``--targeted``)


_COMMITTEE, _LIFETIME = "tests/flower/test_committee.py", "tests/secure/test_party_lifetime.py"
_APPROVAL = ("tests/flower/test_approval.py::test_both_releases_refuse_a_vote_whose_approval_does_not_hold_with_the"
             "_same_code_and_charge_nothing")
_FLAGS = ("tests/secure/test_tally_exclusion.py::test_a_row_one_tally_flags_and_the_others_do_not_is_left_out_at_"
          "every_party")

_SHARE = ("        share = client_noise_share(votes.size, sigma=request.sigma, clients=cfg.clients, "
          "dropout=cfg.dropout,\n                                   kind=cfg.noise)\n")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("halve-share", "the sum ballot adds a share of half the std", "dphype/release/", _SHARE,
             _SHARE.replace("sigma=request.sigma,", "sigma=request.sigma / 2,")),
    Mutation("share-std-0.9", "the sum ballot adds a share of 0.9 times the std", "dphype/release/", _SHARE,
             _SHARE.replace("sigma=request.sigma,", "sigma=request.sigma * 0.9,")),
    Mutation("share-std-1.1", "the sum ballot adds a share of 1.1 times the std (utility, not privacy)",
             "dphype/release/", _SHARE, _SHARE.replace("sigma=request.sigma,", "sigma=request.sigma * 1.1,")),
    Mutation("split-4n", "the sum ballot splits the noise over 4n clients", "dphype/release/", _SHARE,
             _SHARE.replace("clients=cfg.clients,", "clients=4 * cfg.clients,")),
    Mutation("ignore-xi", "the sum ballot ignores xi: each share has variance sigma^2 / n",
             "dphype/release/", _SHARE,
             _SHARE.replace("dropout=cfg.dropout,", "dropout=0.0,")),
    Mutation("share-0.71", "noise_share draws half the variance (std 0.71 sigma: a sqrt(2) sensitivity error)",
             "dphype/privacy/noise.py",
             "    return noise_kind(kind).draw(size, client_noise_variance(sigma, clients, dropout), rng)\n",
             "    return noise_kind(kind).draw(size, 0.5 * client_noise_variance(sigma, clients, dropout), rng)\n"),
    Mutation("request-slack-5%", "check_request accepts 5% more epsilon than sigma gives", "dphype/release/",
             "        if not promised <= cfg.epsilon * (1.0 + EPSILON_RTOL):\n",
             "        if not promised <= cfg.epsilon * 1.05:\n"),
    Mutation("policy-announced-5%", "the node's limit on the announced epsilon has a 5% slack",
             "dphype/node/policy.py",
             "    if announced is not None and announced > policy.max_epsilon * (1 + EPSILON_RTOL):\n",
             "    if announced is not None and announced > policy.max_epsilon * 1.05:\n"),
    Mutation("policy-recomputed-5%", "the node's limit on the recomputed epsilon has a 5% slack",
             "dphype/node/policy.py", "    if eps > policy.max_epsilon * (1 + EPSILON_RTOL):\n",
             "    if eps > policy.max_epsilon * 1.05:\n"),
    Mutation("lifetime-5%", "the lifetime budget has a 5% slack", "dphype/node/ledger.py",
             "        if total > policy.lifetime_epsilon * (1 + EPSILON_RTOL):",
             "        if total > policy.lifetime_epsilon * 1.05:"),
    Mutation("unmask-both-shares", "an unmask reply reveals the mask-key share of survivors too (both shares of "
             "one peer: the server recovers its vector)", "dphype/secure/secagg.py",
             "            b_out.append(b_share)\n        else:\n",
             "            b_out.append(b_share)\n            s_owners.append(owner)\n"
             "            s_out.append(s_share)\n        else:\n"),
    Mutation("clip-check-5%", "the server's check of client clipping has a 5% slack",
             "dphype/flower/final_training.py",
             "        limit = self.clipping_norm * (1.0 + CLIP_TOLERANCE)\n",
             "        limit = self.clipping_norm * 1.05\n"),
    Mutation("receipts-unchecked", "committee members sign survivors that never proved they took part",
             "dphype/secure/secagg.py",
             "    if state.node in consistency_committee(state.graph()):  # a committee member signs only proven "
             "survivors\n", "    if False:\n"),
    Mutation("secagg-any-mode", "a vote answers a request approved for another release mode",
             "dphype/flower/client/approval.py", "    if request.mode.aggregator is not aggregator:\n",
             "    if False:\n", (f"{_APPROVAL}[the approved request is another release's]",)),
    Mutation("share-unbound", "a sealed share binds neither its contributor nor its run",
             "dphype/secure/committee.py",
             '    return f"dphype-argmax-share|{request_digest}|{int(tally)}|{voter}".encode()\n',
             '    return f"dphype-argmax-share|{request_digest}|{int(tally)}".encode()\n'),
    Mutation("served-in-memory", "a tally forgets, on restart, the requests it served",
             "dphype/secure/committee.py",
             "        served = self._served | (self._record.entries() if self._record is not None else set())\n",
             "        served = self._served\n"),
    Mutation("tallies-unpinned", "a node seals to any committee when its operator pinned none",
             "dphype/node/policy.py", "    if committee and known is None:", "    if False:"),
    Mutation("planner-voters", "the planner ignores dropout: all n clients vote", "dphype/selection/forecasts.py",
             "        voters = min_survivors(clients, self.dropout)\n", "        voters = clients\n"),
    Mutation("planner-noise", "the planner ignores dropout in the noise: shares of variance sigma^2 / n",
             "dphype/selection/forecasts.py",
             "    noisy = replay_noisy_sums(votes, sigma=sigma, clients=clients, repetitions=len(votes), rng=rng, "
             "dropout=dropout,\n",
             "    noisy = replay_noisy_sums(votes, sigma=sigma, clients=clients, repetitions=len(votes), rng=rng, "
             "dropout=0.0,\n"),
    # slips the suite did not notice (MPC lifetimes, votes, attribution, pins, bounds), each with its tests
    Mutation("party-plain-tcp", "a tally starts its MPyC party without --ssl although its node config sets TLS",
             "dphype/flower/tally_node.py", "ssl=self.tls is not None", "ssl=False",
             (f"{_COMMITTEE}::test_a_tally_whose_operator_set_tls_runs_its_mpyc_party_with_ssl_in_its_tls_folder",)),
    Mutation("training-epsilon-unbounded", "a training budget's epsilon is checked only above 0",
             "dphype/flower/final_training.py", "        check_epsilon_budget(self.epsilon)\n",
             '        check_positive("epsilon", self.epsilon)\n',
             ("tests/flower/test_training.py::test_a_training_budget_outside_0_to_100_is_refused_for_library_callers"
              "_too",)),
    Mutation("floor-zero", "the committee's floor of valid ballots may reach 0 (noise alone released)",
             "dphype/privacy/noise.py", "    return max(1, survivors - math.ceil(",
             "    return max(0, survivors - math.ceil(",
             ("tests/privacy/test_noise.py::test_the_committee_never_releases_noise_alone_its_floor_of_valid_ballots_"
              "is_at_least_one",)),
    Mutation("skellam-one-sided", "Skellam's tail bound covers one sign only (the sum's failure probability halved)",
             "dphype/privacy/noise_kinds.py", "        return min(1.0, 2.0 * math.exp(log_bound))\n",
             "        return min(1.0, math.exp(log_bound))\n",
             ("tests/privacy/test_noise_kinds.py::test_skellams_tail_bound_covers_both_signs_or_the_secure_sums_failure"
              "_probability_is_understated",)),
    Mutation("flags-intersection", "the parties leave out what every tally flagged, not what any tally flagged",
             "dphype/secure/tally_party.py", "keep = ~np.any(np.array(skewed, dtype=bool), axis=0)",
             "keep = ~np.all(np.array(skewed, dtype=bool), axis=0)", (_FLAGS,)),
    Mutation("flags-own-ignored", "a party ignores its own tally's flags", "dphype/secure/tally_party.py",
             '        invalid = {int(i) for i in job["invalid"]}', "        invalid = set()", (_FLAGS,)),
    Mutation("invalid-row-kept", "a tally keeps an invalid entry's share row in its job instead of zeroing it",
             "dphype/secure/committee.py", "            if i not in bad:\n                rows[i] = entry[\"row\"]",
             "            if entry[\"row\"] is not None:\n                rows[i] = entry[\"row\"]",
             ("tests/secure/test_committee.py::test_an_invalid_entrys_share_row_is_zeroed_in_the_job_so_no_party_ever"
              "_computes_on_it",)),
    Mutation("tally-index-unchecked", "a tally collects for a request listing its key at another index",
             "dphype/flower/tally_node.py",
             " or request.tallies.index(self.keys.public) != self.index:", ":",
             (f"{_COMMITTEE}::test_a_tally_refuses_a_request_listing_its_key_at_another_index_whose_shares_are_another"
              "_partys",)),
    Mutation("pin-cn-only", "the MPyC party pin reads only the subject's common name, not its DNS names",
             "dphype/secure/tally_party.py",
             "        if names != [expected] or any(name != expected for name in dns):",
             "        if names != [expected]:",
             ("tests/secure/test_tally_tls.py::test_a_certificate_whose_other_names_claim_another_party_is_refused_by"
              "_the_pin",)),
    Mutation("leaf-ca", "the federation's PKI issues leaf certificates as CAs", "dphype/node/pki.py",
             "x509.BasicConstraints(ca=False, path_length=None)", "x509.BasicConstraints(ca=True, path_length=None)",
             ("tests/node/test_pki.py::test_every_issued_leaf_certificate_is_not_a_ca_so_no_member_can_mint_"
              "certificates_for_others",)),
    Mutation("training-floor", "private training goes on with the selection's floor of nodes",
             "dphype/app/server_app.py", "    return selection_floor if budget is None else sampled\n",
             "    return selection_floor\n",
             ("tests/app/test_argmax.py::test_private_training_waits_for_every_sampled_node_plaintext_training_for_the"
              "_selections_floor",)),
    Mutation("doctor-spent-exactly", "dphype doctor does not report a lifetime budget spent exactly to its limit",
             "dphype/cli/doctor.py", "    if remaining <= 0:\n", "    if remaining < 0:\n",
             ("tests/cli/test_doctor.py::test_a_lifetime_budget_spent_exactly_to_its_limit_is_reported_because_its_"
              "next_vote_would_be_refused",)),
    Mutation("party-no-lifetime", "an MPyC party has no deadline and no anchor: it waits for a lost peer forever",
             "dphype/secure/tally_party.py", '    bound_lifetime(float(job["deadline"]), int(job["anchor"]))\n', "",
             (f"{_LIFETIME}::test_parties_whose_peer_never_starts_end_at_their_jobs_deadline",
              f"{_LIFETIME}::test_parties_end_when_their_tally_nodes_process_dies_whatever_became_of_their_parent",
              f"{_COMMITTEE}::test_a_server_that_aborts_a_release_at_any_stage_leaves_no_mpc_party_running")),
    Mutation("party-no-anchor-watch", "an MPyC party outlives its tally node's process (until its deadline)",
             "dphype/secure/tally_party.py",
             '    threading.Thread(target=watch, name="anchor-watch", daemon=True).start()\n', "",
             (f"{_LIFETIME}::test_parties_end_when_their_tally_nodes_process_dies_whatever_became_of_their_parent",)),
    Mutation("vote-forgotten", "a node forgets its votes: a re-run of a request in the same run is charged again",
             "dphype/node/vote_memory.py",
             '                    if (int(entry["run"]), str(entry["request"])) == (int(run), request):\n',
             "                    if False:\n",
             (f"{_COMMITTEE}::test_a_request_re_run_in_the_same_run_after_too_few_valid_ballots_charges_each_honest"
              "_voter_once",
              "tests/flower/test_client.py::test_a_sum_request_re_run_in_the_same_run_is_refused_and_charged_once")),
    Mutation("transit-as-voters", "a share spoilt in transit (it does not open, its signature fails) is reported as "
             "its voter's invalid ballot", "dphype/secure/committee.py", '"transit": not sealed_by_sender',
             '"transit": False', ("tests/flower/test_tally_exclusion.py::test_one_misbehaving_member_is_left_out_and_"
                                  "named_for_what_is_known_and_the_release_goes_on",)),
    Mutation("approval-stored-unchecked", "a vote does not check that the stored request is the approved one",
             "dphype/flower/client/approval.py", "    if request.digest() != digest:\n", "    if False:\n",
             (f"{_APPROVAL}[stored request is not the approved one]",)),
)

TEST_FILES: tuple[str, ...] = (
    "tests/flower/test_vote_noise.py", "tests/test_protocol.py", "tests/privacy/test_noise.py",
    "tests/flower/test_server.py", "tests/privacy/test_audit.py", "tests/node/test_policy.py",
    "tests/node/test_request_slack.py", "tests/node/test_ledger.py", "tests/selection/test_planner.py",
    "tests/test_winner_protocol.py", "tests/secure/test_secagg.py", "tests/secure/test_committee.py",
    "tests/flower/test_training.py", "tests/flower/test_client.py", "tests/flower/test_committee.py",
)


def copy_repository(dest: Path) -> None:
    """The repository's tracked and untracked, not ignored, files under ``dest``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def run_file(copy: Path, test_file: str) -> tuple[int, float]:
    """``(pytest exit code, seconds)`` of one test file in ``copy`` (fast suite, stop at the first failure)."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file],
                          cwd=copy, env=env, capture_output=True)
    return done.returncode, time.perf_counter() - start


def apply(copy: Path, mutation: Mutation) -> str:
    """Apply ``mutation`` to ``copy``; return the original text to restore."""
    target = copy / mutation.path
    text = target.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name}: expected the original text once in {mutation.path}, found "
                         f"{text.count(mutation.old)} times (the code moved: update the mutation)")
    target.write_text(text.replace(mutation.old, mutation.new))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[m.name for m in MUTATIONS], help="mutations to run")
    parser.add_argument("--files", nargs="+", default=list(TEST_FILES), help="test files to run")
    parser.add_argument("--targeted", action="store_true",
                        help="run each mutation against only the tests it names (those written to catch it)")
    args = parser.parse_args(argv)
    mutations = [m for m in MUTATIONS if (args.only is None or m.name in args.only) and (m.tests or not args.targeted)]
    baseline = sorted({t for m in mutations for t in m.tests}) if args.targeted else args.files
    with tempfile.TemporaryDirectory(prefix="dphype-mutations-") as folder:
        copy = Path(folder)
        copy_repository(copy)
        where = subprocess.run([sys.executable, "-c", "import dphype; print(dphype.__file__)"], cwd=copy,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not Path(where).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"the copy imports dphype from {where}, not from the copy: the results would lie")
        for test_file in baseline:
            code, seconds = run_file(copy, test_file)
            if code != 0:
                raise SystemExit(f"unmutated: {test_file} fails (exit {code}); fix it before judging mutations")
            print(f"unmutated: {test_file} passes ({seconds:.0f} s)", flush=True)
        caught_all = True
        for mutation in mutations:
            original = apply(copy, mutation)
            try:
                caught = []
                for test_file in mutation.tests if args.targeted else args.files:
                    code, _ = run_file(copy, test_file)
                    if code == 1:  # tests failed (2-4: interrupted, internal or usage error, 5: nothing collected)
                        caught.append(Path(test_file).name)
                    elif code != 0:
                        raise SystemExit(f"mutation {mutation.name}: {test_file} exited {code} (not a test failure)")
            finally:
                (copy / mutation.path).write_text(original)
            caught_all &= bool(caught)
            print(f"{mutation.name:26s} {mutation.what}\n{'':26s} caught by: {', '.join(caught) or 'NOTHING'}",
                  flush=True)
    return 0 if caught_all else 1


if __name__ == "__main__":
    sys.exit(main())
