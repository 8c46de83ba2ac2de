"""`benchmarks/tiers_bench.py` reads pytest's --durations lines into seconds per test."""


def test_durations_sum_setup_call_and_teardown_per_test(load_benchmark):
    tiers = load_benchmark("tiers_bench")
    output = """
============================= slowest durations ==============================
12.50s call     tests/test_a.py::test_one[x-y]
0.50s setup    tests/test_a.py::test_one[x-y]
3.00s teardown tests/test_b.py::test_two
(2 durations < 0.005s hidden.  Use -vv to show these durations.)
1 passed in 16.00s
"""
    assert tiers.durations(output) == {"tests/test_a.py::test_one[x-y]": 13.0, "tests/test_b.py::test_two": 3.0}
