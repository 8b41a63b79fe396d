"""transforms.io.formats.ahead: results in the tasks' order, never more than ``depth`` tasks
started ahead of the caller, and a task's error raised where its result is taken."""

from __future__ import annotations

import threading

import pytest

from transforms.io.formats.ahead import ahead, in_order


def test_results_in_order_with_at_most_depth_tasks_ahead():
    """Even tasks finish at once, odd ones only when the caller reaches them: a reader
    that ran further ahead than ``depth`` would be seen starting them early."""
    for depth in (1, 2, 3):
        started: set[int] = set()
        lock = threading.Lock()
        finish = [threading.Event() for _ in range(40)]
        for i in range(0, 40, 2):
            finish[i].set()

        def task(i: int, started=started, lock=lock, finish=finish):
            def run() -> int:
                with lock:
                    started.add(i)
                assert finish[i].wait(timeout=60), "a task ran before the caller reached it"
                return i * i
            return run

        results = in_order((task(i) for i in range(40)), depth)
        for i in range(40):
            finish[i].set()
            assert next(results) == i * i
            with lock:
                assert max(started) <= i + depth
        assert next(results, None) is None


def test_a_failing_task_raises_where_its_result_is_taken():
    def task(i: int):
        def run() -> int:
            if i == 3:
                raise OSError("disk gone")
            return i
        return run

    results = in_order(task(i) for i in range(6))
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="disk gone"):
        next(results)


def test_ahead_keeps_a_sequential_source_in_order():
    assert list(ahead(iter(range(1000)))) == list(range(1000))
