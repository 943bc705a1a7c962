"""What a deployed node pays per message before and besides its work: CPU seconds of fresh processes.

Flower 1.41's SuperNode starts one ``flwr-clientapp`` process per message, so a loopback deployment's stages
(:mod:`simulations.deployment_profile`) are bounded below by what such a process costs. Each measurement runs
in a fresh Python process (this interpreter, the checkout on ``PYTHONPATH``) and reports its user + system
CPU seconds (``resource.getrusage(RUSAGE_CHILDREN)``), ``--repeat`` times:

* ``clientapp imports``: Flower's ClientApp runtime (``flwr.supernode.cli``, ``flwr.supernode.runtime``)
  and then the bundled ClientApp (``dphype.app.client_app``), with the ``flwr`` modules, torch and scipy that the
  app's import adds on top of the runtime's;
* ``policy check``: :func:`dphype.node.policy.check_vote_request` of the paper's 100-candidate request in a
  process that has already imported the ClientApp (what the masked-input stage paid before it reused the
  pre-flight's guarantee), with the top-level modules it loads;
* ``pre-flight scoring``: what the pre-flight's process does besides Flower's runtime, split into importing
  torch, building the node's task (:func:`dphype.app.client_app.local_task`: loading Adult, the node's shard of
  ``--nodes`` partitions) and scoring the paper's 100 candidates for 5 local epochs (the deployment
  profile's run).

Usage: ``python -m simulations.clientapp_costs [--repeat 3] [--nodes 10] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

IMPORTS = r'''
import json, sys
from flwr.supernode.cli import flwr_clientapp
import flwr.supernode.runtime.run_clientapp
before = set(sys.modules)
import dphype.app.client_app
added = set(sys.modules) - before
print(json.dumps({"flwr modules added by the app": sorted(m for m in added if m.split(".")[0] == "flwr"),
                  "torch": "torch" in sys.modules, "scipy": "scipy" in sys.modules}))
'''

CHECK = r'''
import json, pickle, sys, time
from dphype.app.client_app import app
from dphype.node.policy import NodePolicy, check_vote_request
from dphype.protocol import VoteRequest
request = VoteRequest.from_record(pickle.load(open(sys.argv[1], "rb")))
before = set(sys.modules)
start = time.process_time()
check_vote_request(request, NodePolicy(min_clients=request.config.clients))
print(json.dumps({"seconds": time.process_time() - start,
                  "modules": sorted({m.split(".")[0] for m in set(sys.modules) - before})}))
'''

SCORING = r'''
import json, sys, time
from flwr.app import Context, RecordDict
from dphype.app.client_app import local_task
from dphype.protocol import score_candidates
from dphype.selection.candidates import load_candidates
seconds = {}
start = time.process_time()
import torch
seconds["import torch"] = time.process_time() - start
context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": int(sys.argv[1])},
                  state=RecordDict(), run_config={"dataset": "adult", "local-epochs": 5})
start = time.process_time()
task = local_task(context)
seconds["task (Adult, the shard)"] = time.process_time() - start
start = time.process_time()
score_candidates(task, load_candidates("table3"))
seconds["scoring"] = time.process_time() - start
print(json.dumps(seconds))
'''


def _child(code: str, *args: str) -> tuple[float, dict[str, Any]]:
    """CPU seconds (user + system) of a fresh process running ``code``, and the JSON it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    return cpu, json.loads(out.stdout.strip().splitlines()[-1])


def measure(repeat: int, nodes: int) -> dict[str, Any]:
    from dphype.config import DPHypeConfig
    from dphype.protocol import make_vote_request
    from dphype.selection.candidates import load_candidates

    request = make_vote_request(DPHypeConfig(epsilon=1.0, delta=1e-5, k=3, clients=10), load_candidates("table3"))
    with tempfile.TemporaryDirectory(prefix="dphype-costs-") as folder:
        path = Path(folder) / "request.pkl"
        path.write_bytes(pickle.dumps(dict(request.to_record())))
        imports = [_child(IMPORTS) for _ in range(repeat)]
        checks = [_child(CHECK, str(path))[1] for _ in range(repeat)]
        scoring = [_child(SCORING, str(nodes))[1] for _ in range(repeat)]
    return {"load_average": os.getloadavg(), "preflight_cpu_seconds": scoring,
            "clientapp_import_cpu_seconds": [cpu for cpu, _ in imports], "clientapp_import": imports[-1][1],
            "policy_check_cpu_seconds": [c["seconds"] for c in checks], "policy_check_modules": checks[-1]["modules"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per measurement (default 3)")
    parser.add_argument("--nodes", type=int, default=10, help="partitions of Adult for the scoring (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    out = measure(args.repeat, args.nodes)
    print(f"load average {', '.join(f'{x:.1f}' for x in out['load_average'])}")
    print(f"  ClientApp process imports (Flower runtime + dphype.app.client_app): "
          f"{', '.join(f'{x:.2f}' for x in out['clientapp_import_cpu_seconds'])} CPU s; the app adds "
          f"{out['clientapp_import']}")
    print(f"  check_vote_request in a fresh ClientApp process: "
          f"{', '.join(f'{x:.2f}' for x in out['policy_check_cpu_seconds'])} CPU s, loading "
          f"{', '.join(out['policy_check_modules'])}")
    for name in out["preflight_cpu_seconds"][0]:
        print(f"  pre-flight, {name}: "
              f"{', '.join(f'{run[name]:.2f}' for run in out['preflight_cpu_seconds'])} CPU s")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
