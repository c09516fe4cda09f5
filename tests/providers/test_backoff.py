"""Every wait before a retry (`lousho.backoff`): never shorter than the server asked nor than half the
exponential step, and drawn apart for work that failed together. A server's `Retry-After` that cannot be kept
(0, negative, a date past, not a number) is no wait at all: the backoff decides."""

from __future__ import annotations

import email.utils
import time

import pytest

from lousho.backoff import exponential_s, jittered_s
from lousho.providers._wire import retry_after_seconds
from lousho.providers.base import RetryPolicy

DRAWS = 500


def test_the_exponential_step_doubles_from_its_base_up_to_its_cap() -> None:
    assert [exponential_s(n, base_s=0.5, cap_s=3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_wait_is_at_least_the_floor_and_half_the_step_and_at_most_half_again_the_larger() -> None:
    for floor_s, step_s in [(0.0, 4.0), (1.0, 4.0), (3.0, 4.0), (10.0, 4.0), (2.0, 0.0)]:
        waits = [jittered_s(floor_s=floor_s, step_s=step_s) for _ in range(DRAWS)]
        low, high = max(floor_s, step_s / 2), max(floor_s, step_s / 2) + max(floor_s, step_s) / 2
        assert all(low <= wait <= high for wait in waits), (floor_s, step_s)


def test_the_waits_of_work_that_failed_together_are_spread_over_half_the_wait() -> None:
    waits = [jittered_s(floor_s=1.0, step_s=1.0) for _ in range(DRAWS)]
    assert len(set(waits)) == DRAWS
    assert max(waits) - min(waits) > 0.4  # of the 0.5 s the draws may spread over
    quarters = [sum(1 for wait in waits if 1.0 + q / 8 <= wait < 1.0 + (q + 1) / 8) for q in range(4)]
    assert all(count > DRAWS / 8 for count in quarters), quarters  # no burst at one instant


def test_a_retry_policys_wait_keeps_the_retry_after_up_to_its_max_delay() -> None:
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=8.0)
    assert all(2.0 <= policy.delay_s(1, retry_after_s=2.0) <= 3.0 for _ in range(DRAWS))
    assert all(8.0 <= policy.delay_s(1, retry_after_s=3600.0) <= 12.0 for _ in range(DRAWS))
    assert all(2.0 <= policy.delay_s(4) <= 4.0 for _ in range(DRAWS))  # the step at attempt 4: 4 s


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after": "0"},
        {"retry-after": "-5"},
        {"retry-after": "nan"},
        {"retry-after": "inf"},
        {"retry-after": email.utils.formatdate(time.time() - 3600, usegmt=True)},
        {"retry-after-ms": "0"},
        {"retry-after-ms": "-20", "retry-after": "0"},
        {"retry-after": "soon"},
    ],
    ids=["zero", "negative", "nan", "inf", "a-date-past", "ms-zero", "ms-negative", "not-a-number"],
)
def test_a_retry_after_that_cannot_be_kept_asks_for_no_wait(headers: dict[str, str]) -> None:
    assert retry_after_seconds(headers) is None


def test_a_retry_after_in_seconds_milliseconds_or_a_date_to_come_is_kept() -> None:
    assert retry_after_seconds({"retry-after": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    later = retry_after_seconds({"retry-after": email.utils.formatdate(time.time() + 120, usegmt=True)})
    assert later is not None and 100 < later <= 120
