"""Time bounds that test a promise, never a speed.

A promise such as "a connection silent for 2x the 500 ms heart-beat interval is closed" or "a
request with timeout:1000 is answered stomp-error:timeout" has an exact lower bound: measured
from a moment before the gateway could start its clock, the event may not happen earlier. Its
upper bound is the same figure plus SLACK_S, the scheduling tolerance of a loaded test machine
(every gateway here shares two CPUs with the test process and other work). SLACK_S is not a speed
claim: it only tells "after the promised time" apart from "much later, or never".
"""
from __future__ import annotations

SLACK_S = 2.0


def assert_after_promise(elapsed: float, promised: float, what: str) -> None:
    """`what` happened `elapsed` seconds after a moment before the gateway's clock started:
    not before `promised`, and not later than `promised + SLACK_S`."""
    assert elapsed >= promised, f"{what} after {elapsed:.3f}s, before the promised {promised}s"
    assert elapsed <= promised + SLACK_S, (f"{what} after {elapsed:.3f}s, not within "
                                           f"{SLACK_S}s of the promised {promised}s")


def assert_within_promise(elapsed: float, promised: float, what: str) -> None:
    """`what` happened at most `promised` seconds (+ SLACK_S) after it was asked for."""
    assert elapsed <= promised + SLACK_S, (f"{what} after {elapsed:.3f}s, not within the "
                                           f"promised {promised}s (+{SLACK_S}s slack)")

