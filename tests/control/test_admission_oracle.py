"""The goodput bound (issue 21): a linear program checked on cases solvable by hand."""

from __future__ import annotations

import math

import pytest

from sloctl.control.admission_oracle import goodput_bound


def test_one_shared_resource_serves_every_class_at_the_same_fraction():
    # 10 cores; a costs 1 core-s, b 2; offered 4 and 5/s: t (4 + 2 · 5) = 10, t = 5/7.
    bound = goodput_bound({"a": 4.0, "b": 5.0}, {"a": {"cores": 1.0}, "b": {"cores": 2.0}}, {"cores": 10.0})
    assert bound.goodput_per_s == pytest.approx({"a": 20 / 7, "b": 25 / 7})
    assert bound.total_per_s == pytest.approx(45 / 7)
    assert bound.max_total_per_s == pytest.approx(7.0)  # all of a, then (10 − 4) / 2 = 3 of b
    assert bound.utilisation["cores"] == pytest.approx(1.0)


def test_a_class_stopped_by_its_own_bottleneck_leaves_the_rest_to_the_others():
    # b alone uses the bus (2 units/s): b stops at 2 (a quarter); a takes the 10 − 2 cores left, all its 8.
    bound = goodput_bound({"a": 8.0, "b": 8.0}, {"a": {"cores": 1.0}, "b": {"cores": 1.0, "bus": 1.0}},
                          {"cores": 10.0, "bus": 2.0})
    assert bound.goodput_per_s == pytest.approx({"a": 8.0, "b": 2.0})
    assert bound.utilisation == pytest.approx({"cores": 1.0, "bus": 1.0})


def test_three_classes_and_three_resources_fill_in_order():
    # bus: m ≤ 1; lock: k ≤ 2; cores 10 shared by c (1 each), m (2), k (1). Offered 10 each.
    # Level 1: t = 0.1 (the bus stops m at 1). Level 2: t = 0.2 (the lock stops k at 2).
    # Then c takes the cores left: 10 − 2 · 1 − 2 = 6.
    bound = goodput_bound({"c": 10.0, "m": 10.0, "k": 10.0},
                          {"c": {"cores": 1.0}, "m": {"cores": 2.0, "bus": 1.0}, "k": {"cores": 1.0, "lock": 1.0}},
                          {"cores": 10.0, "bus": 1.0, "lock": 2.0})
    assert bound.goodput_per_s == pytest.approx({"c": 6.0, "m": 1.0, "k": 2.0})


def test_a_tie_is_split_by_the_served_fraction():
    # Equal costs: any split of 10 reaches the total; the bound serves both at the same fraction (4 of 8, 6 of 12).
    bound = goodput_bound({"a": 8.0, "b": 12.0}, {"a": {"cores": 1.0}, "b": {"cores": 1.0}}, {"cores": 10.0})
    assert bound.goodput_per_s == pytest.approx({"a": 4.0, "b": 6.0})


def test_a_class_that_cannot_meet_its_slo_has_no_goodput_to_reach():
    bound = goodput_bound({"a": 4.0, "b": 5.0}, {"a": {"cores": 1.0}, "b": {"cores": 1.0}}, {"cores": 10.0},
                          feasible_share={"b": 0.0})
    assert bound.goodput_per_s == pytest.approx({"a": 4.0, "b": 0.0})
    fraction = bound.fraction({"a": 2.0, "b": 1.0})
    assert fraction["a"] == pytest.approx(0.5) and math.isnan(fraction["b"])


def test_light_load_is_bounded_by_the_offered_rate():
    bound = goodput_bound({"a": 1.0, "b": 2.0}, {"a": {"cores": 1.0}, "b": {"cores": 2.0}}, {"cores": 10.0},
                          feasible_share={"a": 0.5})
    assert bound.goodput_per_s == pytest.approx({"a": 0.5, "b": 2.0})


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"offered_per_s": {"a": -1.0}}, "offered_per_s['a']"),
    ({"capacity": {"cores": 0.0}}, "capacity['cores']"),
    ({"feasible_share": {"a": 1.5}}, "feasible_share['a']"),
    ({"usage": {"a": {"disk": 1.0}}}, "usage['a']"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"offered_per_s": {"a": 1.0}, "usage": {"a": {"cores": 1.0}}, "capacity": {"cores": 1.0}, **kwargs}
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        goodput_bound(**args)
