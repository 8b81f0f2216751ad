"""The demo model's recipe: its train/held-out split and its prompt sets are reproducible, and
the committed checkpoint is what the recipe says."""

import json
import sys

import pytest

from calibration.demo import DemoRecipe, held_out_prompts, is_held_out, stdlib_files
from calibration.demo_files import DEMO_HEADS_DIR, DEMO_MODEL_DIR, DEMO_PROMPTS
from calibration.models import load_model

TRAINING = json.loads((DEMO_MODEL_DIR / "training.json").read_text())


def _read(path):
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()]


def _crc32(data: bytes) -> int:
    """CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), bit by bit: a reference written
    from the definition, independent of zlib."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_split_is_a_fixed_rule_on_relative_paths():
    # the published CRC-32 check value: crc32("123456789") = 0xCBF43926
    assert _crc32(b"123456789") == 0xCBF43926
    # held out when crc32(path) % 10 == 0: random.py 0x8AEA31EA = 2330604010, os.py 0x90FFC377
    # = 2432680823; a salted hash() would change the split between interpreter runs
    assert _crc32(b"random.py") == 0x8AEA31EA and is_held_out("random.py")
    assert _crc32(b"os.py") == 0x90FFC377 and not is_held_out("os.py")
    _, files = stdlib_files()
    assert [is_held_out(f) for f in files] == [_crc32(f.encode()) % 10 == 0 for f in files]
    held = [f for f in files if is_held_out(f)]
    assert 0.05 < len(held) / len(files) < 0.15
    assert all(not f.startswith("/") for f in files)


@pytest.mark.skipif(
    sys.version.split()[0] != TRAINING["python"],
    reason="the prompts come from the stdlib of the Python the demo was trained with",
)
def test_committed_prompts_are_the_recipes_and_calibration_and_validation_are_disjoint():
    root, files = stdlib_files()
    prompts = held_out_prompts(root, files)
    calibration, validation = _read(DEMO_PROMPTS), _read(DEMO_PROMPTS.with_name("demo_prompts_validation.jsonl"))
    assert calibration == prompts[0::2] and validation == prompts[1::2]
    assert not set(calibration) & set(validation)


def test_committed_checkpoint_matches_the_recipe():
    recipe = DemoRecipe(**TRAINING["recipe"])
    lm = load_model("demo", device="cpu")
    cfg = lm.model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (
        recipe.vocab_size,
        recipe.hidden_size,
        recipe.num_layers,
        recipe.intermediate_size,
    )
    assert (lm.heads.num_heads, lm.heads.num_layers) == (recipe.num_medusa_heads, recipe.medusa_layers)
    assert sum(p.numel() for p in lm.model.parameters()) == TRAINING["parameters"]["base"]
    # 16-bit storage, within the size budget of the repository (the whole demo checkpoint with
    # every drafter, the five the demo compares: within 40 MiB)
    total = sum(f.stat().st_size for f in DEMO_MODEL_DIR.rglob("*") if f.is_file())
    assert total <= 40 * 2**20
    assert json.loads((DEMO_HEADS_DIR / "config.json").read_text())["medusa_num_heads"] == recipe.num_medusa_heads
