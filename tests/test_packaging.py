"""The wheel installs flexsearch.attacks and flexsearch.objectives, and no bare top-level packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_subpackages(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), "-q"], check=True)
    wheel = next((tmp_path / "dist").glob("flexsearch-*.whl"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    assert not (target / "attacks").exists() and not (target / "objectives").exists()
    assert (target / "flexsearch" / "attacks").is_dir() and (target / "flexsearch" / "configs").is_dir()
    code = ("import flexsearch, flexsearch.attacks, flexsearch.objectives, flexsearch.items as i;"
            "print(flexsearch.attacks.__file__); print(len(i.load_items('seed').items))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith(str(target)) and int(out[1]) >= 60


def test_editable_install_resolves_subpackages_from_the_tree():
    import flexsearch.attacks
    import flexsearch.objectives

    assert Path(flexsearch.attacks.__file__).parent == ROOT / "attacks"
    assert Path(flexsearch.objectives.__file__).parent == ROOT / "objectives"
