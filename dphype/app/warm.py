"""Importing this module loads the data sets named in `WARM_DATA_ENV` into this process's cache.

For the warm SuperExec's fork server (``dphype superexec --preload dphype.app.warm``,
`dphype.flower.superexec`): every ClientApp task forked from it finds its node's data set already parsed
(`dphype.ml.torch_task.load_cached`) instead of parsing it again for each message it serves. A run that names
another data set loads that one as before.
"""

from __future__ import annotations

import os

from dphype.ml.torch_task import load_cached

#: Environment variable: the data sets to load, comma-separated (``clients/start-voter.sh`` sets the bundled
#: app's default, ``adult``, unless its operator set it; empty: none).
WARM_DATA_ENV = "DPHYPE_WARM_DATA"

for _name in (name.strip() for name in os.environ.get(WARM_DATA_ENV, "").split(",")):
    if _name:
        load_cached(_name)
