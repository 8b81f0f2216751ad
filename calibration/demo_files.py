"""Where the bundled demo model, its heads and its prompts live. Import-light on purpose: the
application layer resolves `--model demo` here without loading torch."""

from pathlib import Path

DEMO_MODEL_DIR = Path(__file__).parent / "demo_model"
DEMO_HEADS_DIR = DEMO_MODEL_DIR / "heads"
DEMO_PROMPTS = Path(__file__).parent / "data" / "demo_prompts.jsonl"
DEMO_VALIDATION_PROMPTS = DEMO_PROMPTS.with_name("demo_prompts_validation.jsonl")
