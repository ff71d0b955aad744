"""Which kinds a pool's workers serve (venturi_operator.serving): the rule as plain functions."""

from __future__ import annotations

from venturi_operator.serving import Coverage, Registration, pool_coverage

MAIL = Registration(pod="mailer-a", queues=("default",), kinds=("mail",))
REPORT = Registration(pod="reporter-a", queues=("default", "bulk"), kinds=("report",))


def test_a_pods_registration_says_what_the_pool_serves() -> None:
    coverage = pool_coverage(
        ["mailer-a", "mailer-b"], [MAIL, REPORT], template="t1", remembered=None
    )
    assert coverage == Coverage(template="t1", registrations=(MAIL,))
    assert coverage.serves("default", "mail")
    assert not coverage.serves("default", "report")  # another pool's worker serves it
    assert not coverage.serves("bulk", "mail")  # its worker does not empty that queue
    assert coverage.registers("mail") and not coverage.registers("report")  # in any queue


def test_a_worker_that_fails_unknown_kinds_serves_every_kind_of_its_queues() -> None:
    fails = Registration(pod="mailer-a", queues=("default",), kinds=("mail",), every_kind=True)
    coverage = pool_coverage(["mailer-a"], [fails], template="t1", remembered=None)
    assert coverage is not None
    assert coverage.serves("default", "anything")
    assert coverage.registers("anything")
    assert not coverage.serves("bulk", "anything")


def test_the_pools_workers_together_serve_the_union_of_their_kinds() -> None:
    # A rolling update: the new pod serves a kind the old one did not.
    new = Registration(pod="mailer-b", queues=("default",), kinds=("mail", "digest"))
    coverage = pool_coverage(["mailer-a", "mailer-b"], [MAIL, new], template="t2", remembered=None)
    assert coverage is not None
    assert coverage.serves("default", "digest") and coverage.serves("default", "mail")


def test_pods_that_write_no_rows_leave_nothing_known() -> None:
    """Workers of an older release, or a pool not seen running yet: every kind counts."""
    assert pool_coverage(["mailer-a"], [REPORT], template="t1", remembered=None) is None
    assert pool_coverage([], [], template="t1", remembered=None) is None


def test_at_zero_the_last_coverage_of_the_same_template_stands() -> None:
    seen = pool_coverage(["mailer-a"], [MAIL], template="t1", remembered=None)
    asleep = pool_coverage([], [REPORT], template="t1", remembered=seen)
    assert asleep == Coverage(template="t1", registrations=(MAIL,), live=False)
    # ... tick after tick while the pool sleeps ...
    assert pool_coverage([], [], template="t1", remembered=asleep) == asleep
    # ... until the pods are replaced by a new template: it may serve more. What the old one
    # served stands, as a probe (the rest asks for one replica), until a new pod registers.
    probe = Coverage(template="t1", registrations=(MAIL,), live=False, probe=True)
    assert pool_coverage([], [], template="t2", remembered=asleep) == probe
    assert pool_coverage([], [], template="t2", remembered=probe) == probe  # tick after tick
    assert probe.registers("report")  # a NOTIFY of any kind may be for the new pods
    new = Registration(pod="mailer-z", queues=("default",), kinds=("mail", "report"))
    assert pool_coverage(["mailer-z"], [new], template="t2", remembered=probe) == Coverage(
        template="t2", registrations=(new,)
    )
    assert pool_coverage([], [], template=None, remembered=asleep) is None


def test_live_rows_replace_what_was_remembered() -> None:
    old = Coverage(template="t1", registrations=(MAIL,), live=False)
    more = Registration(pod="mailer-c", queues=("default",), kinds=("mail", "digest"))
    coverage = pool_coverage(["mailer-c"], [more], template="t1", remembered=old)
    assert coverage == Coverage(template="t1", registrations=(more,))
