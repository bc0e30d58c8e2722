"""Not collected by the suite (its name does not start with test_): run by
tests/test_suite_timeout.py with a short limit to prove a hung test ends the
run with its stack dumped."""

import time


def test_sleeps_past_the_limit() -> None:
    time.sleep(120)  # the line the dump must show
