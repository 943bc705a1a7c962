"""Noise, slack and integrity mutations: plant each fault (wrong noise, slack, over-spends, silently dropped
checks) in a temporary copy of the repository and run the test files that should catch it; print, per
mutation, which test files fail (catch it) and which pass.

    python -m simulations.mutations                    # every mutation against every test file below
    python -m simulations.mutations --only halve-share --files tests/flower/test_vote_noise.py

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
    Mutation("secagg-any-mode", "a SecAgg+ stage answers a request approved for another release mode",
             "dphype/flower/client/__init__.py", "    if request.mode.uses_committee:\n",
             "    if False:\n"),
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
    args = parser.parse_args(argv)
    mutations = [m for m in MUTATIONS if args.only is None or m.name in args.only]
    with tempfile.TemporaryDirectory(prefix="dphype-mutations-") as folder:
        copy = Path(folder)
        copy_repository(copy)
        where = subprocess.run([sys.executable, "-c", "import dphype; print(dphype.__file__)"], cwd=copy,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not Path(where).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"the copy imports dphype from {where}, not from the copy: the results would lie")
        for test_file in args.files:
            code, seconds = run_file(copy, test_file)
            if code != 0:
                raise SystemExit(f"unmutated: {test_file} fails (exit {code}); fix it before judging mutations")
            print(f"unmutated: {test_file} passes ({seconds:.0f} s)", flush=True)
        caught_all = True
        for mutation in mutations:
            original = apply(copy, mutation)
            try:
                caught = []
                for test_file in args.files:
                    code, _ = run_file(copy, test_file)
                    if code == 1:  # tests failed (2-4: interrupted, internal or usage error, 5: nothing collected)
                        caught.append(Path(test_file).name)
                    elif code != 0:
                        raise SystemExit(f"mutation {mutation.name}: {test_file} exited {code} (not a test failure)")
            finally:
                (copy / mutation.path).write_text(original)
            caught_all &= bool(caught)
            print(f"{mutation.name:22s} {mutation.what}\n{'':22s} caught by: {', '.join(caught) or 'NOTHING'}",
                  flush=True)
    return 0 if caught_all else 1


if __name__ == "__main__":
    sys.exit(main())
