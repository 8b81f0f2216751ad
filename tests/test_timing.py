"""treeopt.timing: medians, quantiles, outlier re-measurement, interleaving (fake clock)."""

import pytest

from treeopt.timing import TimingStats, duration_text, measure, measure_interleaved, sample_size


class FakeClock:
    """Time advances only when a timed function runs, by the next scripted duration."""

    def __init__(self, durations):
        self.durations = list(durations)
        self.now = 0.0
        self.calls = 0

    def __call__(self):
        return self.now

    def fn(self):
        d = self.durations[self.calls] if self.calls < len(self.durations) else self.durations[-1]
        self.calls += 1
        self.now += d


def test_measure_median_and_quantiles():
    clock = FakeClock([9.0, 9.0] + [1.0, 2.0, 3.0, 4.0, 5.0])  # two warm-up calls, then 5 samples
    st = measure(clock.fn, repeats=5, warmup=2, clock=clock)
    assert isinstance(st, TimingStats)
    assert st.samples == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert st.median_s == 3.0
    assert st.p10_s == pytest.approx(1.4)  # linear interpolation: 1 + 0.4 * (2 - 1)
    assert st.p90_s == pytest.approx(4.6)
    assert st.remeasured == 0
    assert st.spread == pytest.approx((4.6 - 1.4) / 3.0)


def test_measure_retakes_burst_samples():
    # a 10x burst on the 3rd and 5th samples; the re-takes are normal again
    clock = FakeClock([1.0, 1.0, 10.0, 1.0, 12.0, 1.0, 1.0, 1.0])
    st = measure(clock.fn, repeats=6, warmup=0, clock=clock)
    assert st.remeasured == 2
    assert max(st.samples) == 1.0
    assert st.median_s == 1.0


def test_measure_inner_divides_per_call():
    clock = FakeClock([0.5])
    st = measure(clock.fn, repeats=3, warmup=0, inner=4, clock=clock)
    assert st.median_s == pytest.approx(0.5)
    assert clock.calls == 12


def test_measure_interleaved_shuffles_and_times_each():
    order = []
    clocks = {"a": 1.0, "b": 2.0, "c": 3.0}
    state = {"now": 0.0}

    def make(name):
        def fn():
            order.append(name)
            state["now"] += clocks[name]

        return fn

    stats = measure_interleaved([make("a"), make("b"), make("c")], rounds=6, warmup=0, clock=lambda: state["now"])
    assert [s.median_s for s in stats] == [1.0, 2.0, 3.0]
    rounds = [tuple(order[i : i + 3]) for i in range(0, 18, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len(set(rounds)) > 1  # the order changes between rounds


def test_measure_rejects_no_repeats():
    with pytest.raises(ValueError):
        measure(lambda: None, repeats=0)


def test_sample_size_prices_a_sample_before_any_round():
    # 0.3 ms a call, 2 ms a sample: 1 call (0.3 ms), then 1 x 2 / 0.3 x 1.2 = 8 calls (2.4 ms >= 2 ms)
    clock = FakeClock([3e-4])
    inner, per_call = sample_size(clock.fn, 2e-3, clock)
    assert inner == 8 and per_call == pytest.approx(3e-4)
    assert clock.calls == 1 + 8
    slow = FakeClock([0.5])  # a forward of a large model: one call is a sample
    assert sample_size(slow.fn, 2e-3, slow) == (1, pytest.approx(0.5))


def test_duration_text_rounds_as_an_estimate():
    assert [duration_text(s) for s in (0.2, 40.4, 119, 150, 600, 5399, 5400, 9000)] == [
        "1 s", "40 s", "119 s", "2 min", "10 min", "90 min", "1.5 h", "2.5 h",
    ]  # fmt: skip
