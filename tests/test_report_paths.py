"""Reports record paths that mean something on another machine: relative to the working
directory, or to the installation for the bundled demo; committed reports hold no
development machine's absolute folders."""

from __future__ import annotations

import re
from pathlib import Path

from calibration.demo_files import DEMO_MODEL_DIR
from roofline.shapes import model_shape

ROOT = Path(__file__).resolve().parent.parent
ABSOLUTE = re.compile(r"(?<![\w.])/(home|root|work|tmp|Users|var/folders)/")


def test_a_model_shape_records_its_config_without_the_machines_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_shape(str(DEMO_MODEL_DIR)).source == "calibration/demo_model/config.json"
    own = tmp_path / "mine"
    own.mkdir()
    (own / "config.json").write_text((DEMO_MODEL_DIR / "config.json").read_text())
    assert model_shape(str(own)).source == "mine/config.json"


def test_committed_reports_embed_no_absolute_paths():
    found = []
    for path in (ROOT / "reports").rglob("*"):
        if path.suffix in (".md", ".json", ".csv") and path.is_file():
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if ABSOLUTE.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)
