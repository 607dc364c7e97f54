"""Group-relative advantages and the unusable-group test (pure functions)."""

from __future__ import annotations

import math

import pytest

from polar_mq.rl.advantages import group_advantages, unusable_reason


def test_mean_std_matches_grpo_with_bessel_std():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    std = math.sqrt(sum((r - 0.5) ** 2 for r in [1, 0, 0, 1]) / 3)
    a = 0.5 / (std + 1e-4)
    assert adv == pytest.approx([a, -a, -a, a])
    assert sum(adv) == pytest.approx(0.0)
    assert group_advantages([1.0, 0.0], scale=False) == [0.5, -0.5]


def test_leave_one_out_is_reward_minus_mean_of_the_others():
    rewards = [1.0, 0.0, 0.5, 0.25]
    adv = group_advantages(rewards, "leave_one_out")
    for i, r in enumerate(rewards):
        others = [x for j, x in enumerate(rewards) if j != i]
        assert adv[i] == pytest.approx(r - sum(others) / len(others))
    assert group_advantages(rewards, "rloo") == adv


def test_masked_rewards_take_no_part():
    assert group_advantages([1.0, None, 0.0], "leave_one_out") == [1.0, None, -1.0]
    assert group_advantages([None, 0.7]) == [None, 0.0]
    with pytest.raises(ValueError):
        group_advantages([1.0], "ppo")


def test_unusable_groups():
    assert unusable_reason(["ERROR", "ERROR"], [None, None]) == "all_error"
    assert unusable_reason(["COMPLETED", "ERROR"], [1.0, None]) is None
    assert unusable_reason(["COMPLETED", "COMPLETED"], [1.0, 1.0]) is None
    assert unusable_reason(["COMPLETED", "COMPLETED"], [1.0, 1.0], drop_uniform_reward=True) == "uniform_reward"
    assert unusable_reason(["COMPLETED", "TIMEOUT"], [1.0, 0.0], drop_uniform_reward=True) is None
    assert unusable_reason(["COMPLETED", "ERROR"], [1.0, None], drop_uniform_reward=True) == "too_few_rewards"
