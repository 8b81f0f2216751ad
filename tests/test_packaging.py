"""A non-editable install (`pip install .`) carries every file the bundled demo reads: the
model, its Medusa heads, the Hydra heads, the MLP speculator and the draft model
(`treeopt run --drafter ...` on the demo), and the demo prompts. Checked by building the wheel
from the tracked files and listing it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.slow
def test_the_wheel_holds_every_demo_folder(tmp_path):
    src = tmp_path / "src"
    for name in tracked("."):
        if name.split("/")[0] in ("treeopt", "calibration", "roofline", "pyproject.toml", "README.md"):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    subprocess.run([*build, str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("treeopt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    demo = [n for n in tracked("calibration/demo_model") + tracked("calibration/data")]
    for folder in ("heads", "hydra", "mlp_speculator", "draft"):
        assert any(n.startswith(f"calibration/demo_model/{folder}/") for n in demo), folder
    missing = [n for n in demo if n not in names]
    assert not missing, f"not in the wheel: {missing}"
