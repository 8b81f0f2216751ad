"""The CUDA-graph branch of the static-shape steps (calibration.static_steps,
docs/decoder.md#static-shape-steps), on a CUDA GPU in float32. Skipped where there is none (CI):
run them on a GPU with `python -m pytest tests/test_cuda_steps.py`.

What only a GPU can show: a captured step replayed with new inputs computes what the eager
forward computes. A graph freezes every Python value it was captured with, so a forward that
read the cache's length, the context or the batch's contents from Python rather than from the
static input buffers would replay the first call's numbers. The references are independent of
the capture: the eager forward on the same cache, and plain greedy decoding through the
library's own cache (`greedy_decode`)."""

from __future__ import annotations

import pytest
import torch

from calibration.data import read_prompt_texts
from calibration.decoder import TreeDecoder, cut_tree
from calibration.demo_files import DEMO_PROMPTS
from calibration.greedy import greedy_decode
from calibration.hwbench import Replayed
from calibration.kv_cache import new_cache
from calibration.model_calls import lm_head, model_forward_hidden
from calibration.models import load_model, tiny_model_for_tests
from calibration.static_steps import GraphStep, StepRunner
from calibration.sweep import prompt_batches, step_bench
from treeopt.app.hwcalibrate import calibrate_hardware
from treeopt.tree import load_tree, make_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ATOL = 1e-4  # float32 on a GPU: the captured and eager kernels are the same, up to TF32 off
VOCAB = 64


@pytest.fixture(autouse=True, scope="module")
def _no_tf32():
    """float32 matmuls in full precision, so that eager and replayed steps compare to ATOL."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with GQA (4 query heads, 2 KV heads) and 3 random Medusa heads, on CUDA."""
    path = tiny_model_for_tests(
        tmp_path_factory.mktemp("tiny"), vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2, num_medusa_heads=3
    )
    return load_model(str(path), device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def demo():
    """The bundled demo model with its trained Medusa heads, on CUDA in float32."""
    return load_model("demo", device="cuda", dtype="float32")


def _captured(runner: StepRunner) -> int:
    """Steps of `runner` that replay a captured graph (not the eager fallback)."""
    return sum(isinstance(step.run, GraphStep) for step in runner._steps.values())


def test_replayed_steps_follow_the_cache_as_it_fills(tiny):
    """One captured shape (window 64) replayed at starts 10, 13, 16, ...: each replay's logits
    and the keys it writes equal the eager forward's on a cache holding the same tokens."""
    model = tiny.model
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, VOCAB, (2, 10), generator=g).cuda()
    caches = [new_cache(model, capacity=64), new_cache(model, capacity=64)]
    with torch.inference_mode():
        for cache in caches:
            model_forward_hidden(
                model, prompt, attention_mask=None, position_ids=torch.arange(10).cuda().expand(2, -1), cache=cache
            )
    runner = StepRunner(model, graphs=True, bucket=64)
    q = 3
    for step in range(8):
        start = 10 + q * step
        tokens = torch.randint(3, VOCAB, (2, q), generator=g).cuda()
        positions = (start + torch.arange(q)).cuda().expand(2, -1)
        causal = torch.full((q, start + q), torch.finfo(torch.float32).min, device="cuda")
        causal[:, :start] = 0
        causal[:, start:] = torch.triu(causal[:, start:], diagonal=1)
        mask = causal.expand(2, 1, q, start + q)
        with torch.inference_mode():
            logits, hidden = runner(caches[0], tokens, mask, positions)
            eager_hidden = model_forward_hidden(
                model, tokens, attention_mask=mask, position_ids=positions, cache=caches[1]
            )
            eager_logits = lm_head(model, eager_hidden)
        torch.testing.assert_close(logits, eager_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(hidden, eager_hidden, atol=ATOL, rtol=0)
        assert caches[0].length == caches[1].length == start + q
        torch.testing.assert_close(
            caches[0].buffer[..., : start + q, :], caches[1].buffer[..., : start + q, :], atol=ATOL, rtol=0
        )
    assert _captured(runner) == 1 and not runner.notes  # one shape, captured, replayed 8 times


@pytest.mark.parametrize("verification", ["tree", "candidates"])
def test_graph_decoding_of_the_demo_is_plain_greedy(demo, verification):
    """Greedy tree decoding with captured steps emits plain greedy decoding's tokens on the
    demo's prompts: batch 4 with padding, sequences leaving the batch at eos (new shapes,
    new captures), windows crossing 64-slot buckets; and it accepts several tokens a step."""
    prompts = read_prompt_texts(DEMO_PROMPTS)[:4]
    ids, mask = prompt_batches(demo.tokenizer, prompts, 4, demo.device)[0]
    n = 96
    eos = demo.tokenizer.eos_token_id
    reference = greedy_decode(demo.model, ids, mask, max_new_tokens=n, eos_token_id=eos)
    tree = cut_tree(load_tree("mc_sim_7b_63"), demo.heads.num_heads, 10)
    decoder = TreeDecoder(demo.model, demo.heads, tree, verification=verification)
    assert decoder.steps == "cuda-graphs"  # the default on CUDA
    result = decoder.generate(ids, mask, max_new_tokens=n, eos_token_id=eos)
    assert result.tokens == reference
    assert result.tokens_per_step > 1.5
    assert _captured(decoder.runner) >= 2 and not decoder.runner.notes


def test_graph_decoding_of_a_tiny_gqa_model_is_plain_greedy(tiny):
    """The same with random heads, GQA, batch 1 and the empty tree (the plain step captured)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB, (3, 7), generator=g).cuda()
    reference = greedy_decode(tiny.model, ids, max_new_tokens=40)
    for tree in (make_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]), make_tree([], allow_empty=True)):
        decoder = TreeDecoder(tiny.model, tiny.heads, tree, graphs=True)
        assert decoder.generate(ids, max_new_tokens=40).tokens == reference
        assert decoder.generate(ids[1:2], max_new_tokens=40).tokens == reference[1:2]
        assert _captured(decoder.runner) >= 1 and not decoder.runner.notes


def test_sweep_steps_capture_and_crop_back(tiny):
    """The sweep's timed steps on CUDA: each size's captured step gives the eager step's logits
    on the same cache and tokens, and every call crops its append (the cache keeps exactly the
    context, however often a step is replayed)."""
    tree = make_tree([[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0]])
    context = 37
    benches = {
        graphs: step_bench(tiny, tree, (0, 1, 4, 7), 2, context, seed=1, graphs=graphs) for graphs in (True, False)
    }
    for bench in benches.values():
        for fn in bench.fns:
            for _ in range(3):
                fn()
        assert bench.cached_tokens() == context
    graph, eager = benches[True], benches[False]
    for n in (1, 4, 7):
        assert torch.equal(graph.inputs[n], eager.inputs[n])
        assert _captured(graph.decoders[n].runner) == 1 and graph.decoders[n].steps == "cuda-graphs"
        outs = []
        for bench in (graph, eager):
            decoder = bench.decoders[n]
            logits, _ = decoder.verify_forward(bench.cache, bench.inputs[n], bench.valid, bench.positions)
            outs.append(logits.clone())
            bench.cache.crop(-decoder.verify_appends)
        torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=0)
        assert graph.cached_tokens() == eager.cached_tokens() == context


def test_a_replayed_microbenchmark_makes_all_its_calls():
    """`hw calibrate` divides a captured microbenchmark's replay time by its calls: one replay
    must run the function that many times."""
    x = torch.zeros(1024, device="cuda")
    replay = Replayed(lambda: x.add_(1.0), 16, torch.cuda.synchronize)
    before = x.clone()
    replay()
    assert replay.calls == 16 and torch.equal(x - before, torch.full_like(x, 16.0))


def test_hw_calibrate_times_captured_forwards_on_cuda():
    """By default on CUDA the framework forwards are captured steps, as the sweep's are, and cost
    less than the same forwards run eagerly (the launches a graph saves); both profiles say how
    they were measured."""
    kwargs = {"dtype": "fp32", "quick": True, "progress": False}
    captured = calibrate_hardware("cuda", "demo", **kwargs)
    eager = calibrate_hardware("cuda", "demo", graphs=False, **kwargs)
    assert captured.calibration["steps"] == "cuda-graphs" and not captured.calibration["failed_captures"]
    assert eager.calibration["steps"] == "eager"
    fast = captured.calibration["framework_fit"]["measured_s"]
    slow = eager.calibration["framework_fit"]["measured_s"]
    assert len(fast) == len(slow) and sum(f < s for f, s in zip(fast, slow)) == len(fast)
