"""Fixtures shared by the unit tests."""

import threading

import pytest


@pytest.fixture
def in_threads():
    """``run(fn, args_list)``: ``fn(*args)`` for each ``args`` on a thread of its own, all at once; returns what
    they raised (a server's request threads, a loader's workers)."""
    def run(fn, args_list) -> list[BaseException]:
        errors = []

        def one(args):
            try:
                fn(*args)
            except Exception as e:          # noqa: BLE001 - returned to the test
                errors.append(e)
        threads = [threading.Thread(target=one, args=(args,)) for args in args_list]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors
    return run
