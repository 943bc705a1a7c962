"""`pip install dphype` installs the library only, with its data files and py.typed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_contains_only_the_dphype_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("dphype-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"dphype", next(n for n in top if n.endswith(".dist-info"))}, top
    assert "dphype/py.typed" in names and "dphype/data/adult.data.gz" in names
    assert not any(name.startswith(("server/", "clients/", "simulations/", "tests/")) for name in names)
