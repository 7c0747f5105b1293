"""When a certificate renews (docs/lifecycle.md, "The lifecycle"): the ARI window when the CA gives one, else
when 1/3 of the lifetime remains (1/2 for lifetimes under 10 days)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from workflows.policy import (
    certificate_fraction,
    cooldown_spread,
    renewal_time,
    spread_renewal_time,
)

ISSUED = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _renews_after(lifetime: timedelta, fraction: float = 0.5) -> timedelta:
    """How long after issuance a certificate of this lifetime renews (no ARI)."""
    return renewal_time(ISSUED, ISSUED + lifetime, None, fraction) - ISSUED


@pytest.mark.parametrize(
    ("lifetime", "renews_after"),
    [
        pytest.param(timedelta(days=90), timedelta(days=60), id="90-day: at 60 days"),
        pytest.param(timedelta(days=45), timedelta(days=30), id="45-day: at 30 days"),
        pytest.param(timedelta(days=64), timedelta(days=64) * 2 / 3, id="64-day: 2/3"),
        pytest.param(timedelta(days=6), timedelta(days=3), id="6-day: at 3 days (1/2 rule)"),
        pytest.param(timedelta(hours=160), timedelta(hours=80), id="160-hour: 1/2 rule"),
        pytest.param(
            timedelta(days=10),
            timedelta(days=10) * 2 / 3,
            id="exactly 10 days: the 1/3 rule, not the 1/2 one",
        ),
        pytest.param(
            timedelta(days=10) - timedelta(seconds=1),
            (timedelta(days=10) - timedelta(seconds=1)) / 2,
            id="just under 10 days: 1/2 rule",
        ),
    ],
)
def test_lifetime_rules(lifetime: timedelta, renews_after: timedelta) -> None:
    assert _renews_after(lifetime) == renews_after


def test_exactly_ten_days_renews_when_a_third_remains() -> None:
    not_after = ISSUED + timedelta(days=10)
    assert renewal_time(ISSUED, not_after, None, 0.0) == not_after - timedelta(days=10) / 3
    assert not_after - renewal_time(ISSUED, not_after, None, 0.0) == timedelta(days=3, hours=8)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0, -5.0, 7.0])
def test_fraction_does_not_matter_without_a_window(fraction: float) -> None:
    assert _renews_after(timedelta(days=90), fraction) == timedelta(days=60)


def test_a_let_s_encrypt_style_inclusive_not_after() -> None:
    # Let's Encrypt's 90-day certificates end one second short of 90 days.
    lifetime = timedelta(days=90) - timedelta(seconds=1)
    assert _renews_after(lifetime) == lifetime * 2 / 3


WINDOW_START = ISSUED + timedelta(days=55)
WINDOW_END = WINDOW_START + timedelta(hours=48)
NOT_AFTER = ISSUED + timedelta(days=90)


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [
        pytest.param(0.0, WINDOW_START, id="0: start"),
        pytest.param(0.5, WINDOW_START + timedelta(hours=24), id="0.5: middle"),
        pytest.param(1.0, WINDOW_END, id="1: end"),
        pytest.param(0.25, WINDOW_START + timedelta(hours=12), id="0.25"),
        pytest.param(-0.5, WINDOW_START, id="below 0 clamps to the start"),
        pytest.param(1.5, WINDOW_END, id="above 1 clamps to the end"),
    ],
)
def test_ari_window(fraction: float, expected: datetime) -> None:
    assert renewal_time(ISSUED, NOT_AFTER, (WINDOW_START, WINDOW_END), fraction) == expected


def test_ari_window_overrides_the_lifetime_rule_even_when_later() -> None:
    # The CA knows best (e.g. nothing to do yet): its window wins over 1/3.
    late = (NOT_AFTER - timedelta(days=2), NOT_AFTER - timedelta(days=1))
    assert renewal_time(ISSUED, NOT_AFTER, late, 0.0) == late[0]
    # ... and a window in the past (revoked / mass-renewal) means "now-ish".
    past = (ISSUED - timedelta(days=2), ISSUED - timedelta(days=1))
    assert renewal_time(ISSUED, NOT_AFTER, past, 1.0) == past[1]


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize(
    "end", [WINDOW_START, WINDOW_START - timedelta(hours=1)], ids=["end == start", "end < start"]
)
def test_degenerate_ari_window_is_its_start(fraction: float, end: datetime) -> None:
    assert renewal_time(ISSUED, NOT_AFTER, (WINDOW_START, end), fraction) == WINDOW_START


def test_result_is_timezone_aware_and_within_validity() -> None:
    for lifetime in (timedelta(days=6), timedelta(days=10), timedelta(days=45), timedelta(days=90)):
        at = renewal_time(ISSUED, ISSUED + lifetime, None, 0.5)
        assert at.tzinfo is not None
        assert ISSUED < at < ISSUED + lifetime


# -- spread (issue: no herds) -------------------------------------------------------


def test_certificates_issued_together_renew_apart() -> None:
    """Without ARI, 1,000 certificates issued in the same second renew over the last
    10 % before the 1/3 mark, not in one second; each one's time is fixed (the
    same for every run and replay of its workflow)."""
    lifetime = timedelta(days=90)
    mark = ISSUED + timedelta(days=60)
    times = [
        spread_renewal_time(ISSUED, ISSUED + lifetime, None, certificate_fraction(f"h{i}.test", ISSUED))
        for i in range(1000)
    ]
    assert all(mark - timedelta(days=6) <= t <= mark for t in times)
    assert max(times) - min(times) > timedelta(days=5)  # spread over nearly the whole 6 days
    assert len(set(times)) == 1000
    again = spread_renewal_time(ISSUED, ISSUED + lifetime, None, certificate_fraction("h7.test", ISSUED))
    assert again == times[7]


def test_fraction_is_fixed_per_certificate_and_moves_with_a_new_one() -> None:
    first = certificate_fraction("shop.example.com", ISSUED)
    assert first == certificate_fraction("shop.example.com", ISSUED)
    assert 0.0 <= first < 1.0
    assert first != certificate_fraction("shop.example.com", ISSUED + timedelta(days=60))


def test_an_ari_window_is_used_whole_when_it_ends_before_not_after() -> None:
    start, end = ISSUED + timedelta(days=60), ISSUED + timedelta(days=62)
    window = (start, end)
    assert spread_renewal_time(ISSUED, ISSUED + timedelta(days=90), window, 0.0) == start
    assert spread_renewal_time(ISSUED, ISSUED + timedelta(days=90), window, 1.0) == end


@pytest.mark.parametrize(
    ("window_days", "latest"),
    [
        # A window over the whole second half: its first half wins (day 67.5 < day 88).
        pytest.param((45, 90), timedelta(days=67, hours=12), id="first half of the window"),
        # A window of the last 3 days: 2 days before notAfter wins over its midpoint.
        pytest.param((87, 90), timedelta(days=88), id="2 days before notAfter"),
    ],
)
def test_a_window_running_to_not_after_leaves_room_for_the_failure_budget(
    window_days: tuple[int, int], latest: timedelta
) -> None:
    not_after = ISSUED + timedelta(days=90)
    window = (ISSUED + timedelta(days=window_days[0]), ISSUED + timedelta(days=window_days[1]))
    assert spread_renewal_time(ISSUED, not_after, window, 1.0) == ISSUED + latest
    assert spread_renewal_time(ISSUED, not_after, window, 0.0) == window[0]


def test_a_revocation_window_in_the_past_renews_now() -> None:
    """ARI answers a revoked certificate with a window in the past: renew at once."""
    not_after = ISSUED + timedelta(days=90)
    past = (ISSUED - timedelta(days=2), ISSUED - timedelta(days=1))
    assert spread_renewal_time(ISSUED, not_after, past, 0.7) < ISSUED


@pytest.mark.parametrize(
    ("cooldown", "window"),
    [(1.0, 5.0), (30.0, 5.0), (600.0, 60.0), (12_120.0, 1212.0)],
)
def test_cooldown_spread_is_uniform_over_five_seconds_or_a_tenth(cooldown: float, window: float) -> None:
    assert cooldown_spread(cooldown, 0.0) == 0.0
    assert cooldown_spread(cooldown, 0.999999) == pytest.approx(window, rel=1e-5)
    assert cooldown_spread(cooldown, 0.5) == pytest.approx(window / 2)
