"""``python -m simulations <study> ...`` from the repository root: the paper's benchmark studies
(:mod:`simulations.cli`; ``dphype bench`` runs this program)."""

import sys

from simulations.cli import main

sys.exit(main())
