"""SGLang's own start-up checks of a speculative server (treeopt/sglang_rules.py,
docs/engines.md#sglang-server-checks). Expected verdicts are SGLang's documented behaviour:
`_handle_eagle_family` in python/sglang/srt/arg_groups/speculative_hook.py raises for topk > 1
with trtllm_mha, for rejection sampling with topk != 1 or a non-EAGLE algorithm, and for
topk > 1 with page size > 1 outside flashinfer/fa3/triton; `adaptive_unsupported_reason`
switches adaptive steps off for topk != 1."""

from __future__ import annotations

import numpy as np
import pytest

from treeopt.engine_data import get_engine
from treeopt.engines import export_for, sglang_tree
from treeopt.sglang_rules import sglang_refusal, sglang_warnings


@pytest.mark.parametrize(
    ("algorithm", "topk", "backend", "page", "rejection", "refused"),
    [
        ("EAGLE", 1, "trtllm_mha", 1, False, False),
        ("EAGLE", 2, "trtllm_mha", 1, False, True),
        ("EAGLE3", 4, "flashinfer", 16, False, False),
        ("EAGLE3", 4, "fa3", 16, False, False),
        ("EAGLE3", 4, "triton", 16, False, False),
        ("EAGLE3", 4, "flashmla", 16, False, True),
        ("EAGLE3", 4, "flashmla", 1, False, False),
        ("EAGLE3", 1, "flashmla", 64, False, False),
        ("EAGLE", 1, None, 1, True, False),
        ("EAGLE", 2, None, 1, True, True),
        ("STANDALONE", 1, None, 1, True, True),
        ("STANDALONE", 4, None, 1, False, False),
    ],
)
def test_sglang_refusals(algorithm, topk, backend, page, rejection, refused):
    got = sglang_refusal(algorithm, topk, attention_backend=backend, page_size=page, rejection_sampling=rejection)
    assert (got is not None) == refused, got


def test_sglang_warnings_not_refusals():
    assert sglang_warnings(3, 1, 8) and not sglang_warnings(3, 1, 4)
    assert any("adaptive disabled" in w for w in sglang_warnings(3, 2, 6, adaptive=True))
    assert not sglang_warnings(3, 1, 4, adaptive=True)


def test_every_sglang_export_starts_and_a_tree_says_what_refuses_it():
    acc = np.array([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.2, 0.1]])
    engine = get_engine("sglang")
    for steps, topk, tokens in ((1, 1, 2), (2, 1, 3), (3, 1, 4), (2, 2, 4), (3, 2, 6), (3, 3, 8)):
        export = export_for(engine, sglang_tree(acc, steps, topk, tokens), accuracy=acc)
        flags = export.line.split()
        got_topk = int(flags[flags.index("--speculative-eagle-topk") + 1])
        algorithm = flags[flags.index("--speculative-algorithm") + 1]
        assert sglang_refusal(algorithm, got_topk) is None  # the line alone starts
        # a tree's line says in a comment which server flags refuse it; a chain's needs none
        assert ("trtllm_mha" in export.text) == (got_topk > 1), export.text
        if got_topk > 1:
            assert sglang_refusal(algorithm, got_topk, attention_backend="trtllm_mha")
