"""bench/bench_pretrain_e2e.py's stall arithmetic (no timing: fake clocks). The stall is signed
and comes with its spread (clipping noise to 0 had reported 0-18% "stalls" for one pipeline),
and the alternated runs swap their order every round."""
import importlib.util
import math
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
spec = importlib.util.spec_from_file_location(
    "bench_pretrain_e2e", os.path.join(ROOT, "bench", "bench_pretrain_e2e.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def fake_runs(step_model, step_e2e, order):
    """Two runs that append (wall, cpu) clock readings as if each step took the given time."""
    times, now = [], [0.0]

    def run_of(name, step):
        def run(steps):
            order.append(name)
            for _ in range(steps):
                now[0] += step
                times.append((now[0], now[0] / 2))
        return run

    return run_of("model", step_model), run_of("e2e", step_e2e), times


def test_alternate_swaps_the_order_every_round():
    order = []
    model, e2e, times = fake_runs(0.5, 0.5, order)
    laps = bench.alternate(model, e2e, times, warmup=2, per_run=3, rounds=4)
    assert order == ["model", "e2e", "e2e", "model", "model", "e2e", "e2e", "model"]
    assert [len(r) for r in laps["model"]] == [3] * 4 and [len(r) for r in laps["e2e"]] == [3] * 4
    assert all(lap == (0.5, 0.25) for r in laps["e2e"] for lap in r)


def test_stall_is_signed_with_its_spread():
    laps = {"model": [[(0.5, 1.0)] * 2, [(0.5, 1.0)] * 2],
            "e2e": [[(0.55, 1.0)] * 2, [(0.45, 1.0)] * 2]}
    s = bench.stall_summary(laps)
    # End to end faster in one round, slower in the other: no stall, and a wide spread.
    assert math.isclose(s["stall"], 0.0, abs_tol=1e-12)
    assert s["stall_rounds"][1] < 0 < s["stall_rounds"][0]
    assert s["stall_2se"] > 0.1
    assert math.isclose(s["cpu_share"], 0.0, abs_tol=1e-12)

    slower = {"model": laps["model"], "e2e": [[(0.45, 1.0)] * 2] * 2}
    assert bench.stall_summary(slower)["stall"] < 0  # not clipped to 0


def test_stall_and_cpu_share_of_a_real_stall():
    laps = {"model": [[(0.4, 0.8)] * 3] * 3, "e2e": [[(0.5, 0.9)] * 3] * 3}
    s = bench.stall_summary(laps)
    assert math.isclose(s["stall"], 0.2) and math.isclose(s["stall_2se"], 0.0, abs_tol=1e-12)
    assert math.isclose(s["cpu_share"], 1 - 0.8 / 0.9)
    assert math.isnan(bench.stall_summary({"model": laps["model"][:1],
                                           "e2e": laps["e2e"][:1]})["stall_2se"])
