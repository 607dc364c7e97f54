"""polar_mq groups -> trainer rows (polar_mq.rl.trainers): TrainSample, slime Sample fields, verl
DataProto fields — on real trajectories of real agent sessions (prefix_merging: a tool call, the
tool result, a final answer in one trace), without slime's or verl's packages."""

from __future__ import annotations

import copy

import pytest

from polar_mq.rl.trainers import samples_from_group
from polar_mq.rl.trainers.slime import sample_fields
from polar_mq.rl.trainers.slime import to_samples
from polar_mq.rl.trainers.verl import agent_loop_outputs
from polar_mq.rl.trainers.verl import batch_fields
from tests.support.trainer import drain, real_group, rollout_stack  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def group(rollout_stack):  # noqa: F811
    _, client = rollout_stack
    drain(client)
    g = real_group(client, "mapping-g1", samples=3, policy_version=3)
    assert all(s["state"] == "COMPLETED" for s in g["sessions"]), g["sessions"]
    return g


def graded(group, rewards):
    """The same real group with other rewards (the stand-in answers every sample alike)."""
    g = copy.deepcopy(group)
    for traj, r in zip(g["trajectories"], rewards):
        traj["reward"] = r
    return g


def test_samples_keep_the_recorded_ids_mask_and_logprobs(group):
    g = graded(group, [1.0, 0.0, 0.0])
    batch = samples_from_group(g)
    assert batch.skipped is None and len(batch.samples) == 3
    for s, traj in zip(batch.samples, g["trajectories"]):
        tr = traj["traces"][0]
        assert s.prompt_ids == tr["prompt_ids"] and s.response_ids == tr["response_ids"]
        assert s.loss_mask == tr["loss_mask"] and s.behaviour_logprobs == tr["response_logprobs"]
        # prefix_merging spliced the tool result in: masked, logprob 0
        assert 0 in s.loss_mask and 1 in s.loss_mask
        assert all(lp == 0.0 for lp, m in zip(s.behaviour_logprobs, s.loss_mask) if not m)
        assert s.policy_version == 3
    adv = [s.advantage for s in batch.samples]
    assert adv[0] > 0 > adv[1] and adv[1] == pytest.approx(adv[2])
    assert sum(adv) == pytest.approx(0.0, abs=1e-6)


def test_unusable_groups_and_error_sessions_are_left_out(group):
    assert samples_from_group(graded(group, [1.0, 1.0, 1.0])).skipped.startswith("every usable")
    g = graded(group, [1.0, 0.0, None])
    batch = samples_from_group(g)
    assert [s.session_id for s in batch.samples] == [t["session_id"] for t in g["trajectories"][:2]]
    assert batch.dropped_sessions == [g["trajectories"][2]["session_id"]]
    with pytest.raises(ValueError, match="unknown advantage"):
        samples_from_group(g, advantage="nope")


def test_slime_sample_fields(group):
    g = graded(group, [0.0, 1.0, 0.5])
    fields = sample_fields(g, group_index=7, start_index=10)
    assert [f["index"] for f in fields] == [10, 11, 12] and {f["group_index"] for f in fields} == {7}
    for f, traj in zip(fields, g["trajectories"]):
        tr = traj["traces"][0]
        assert f["tokens"] == tr["prompt_ids"] + tr["response_ids"]
        assert f["response_length"] == len(tr["response_ids"]) == len(f["loss_mask"]) == len(f["rollout_log_probs"])
        assert f["tokens"][-f["response_length"]:] == tr["response_ids"]
        assert f["reward"] == traj["reward"] and f["weight_versions"] == ["3"]
        assert f["status"] == "completed" and f["session_id"] == traj["session_id"]
        assert f["prompt"] and all(m["role"] != "assistant" for m in f["prompt"])
        assert f["metadata"]["group_id"] == "mapping-g1"
    # slime is not installed here: the same fields come back as dicts
    assert to_samples(g, group_index=7, start_index=10) == fields


def test_verl_batch_fields(group):
    np = pytest.importorskip("numpy")
    g1, g2 = graded(group, [1.0, 0.0, 0.0]), graded(group, [0.0, 0.0, 1.0])
    g2["task_id"] = "mapping-g2"
    t, nt = batch_fields([g1, g2], pad_id=0)
    n = 6
    assert t["input_ids"].shape == (n, t["prompts"].shape[1] + t["responses"].shape[1])
    assert list(nt["uid"]) == ["mapping-g1"] * 3 + ["mapping-g2"] * 3
    for i, traj in enumerate(g1["trajectories"] + g2["trajectories"]):
        tr = traj["traces"][0]
        lp, lr = len(tr["prompt_ids"]), len(tr["response_ids"])
        P = t["prompts"].shape[1]
        assert t["prompts"][i, P - lp:].tolist() == tr["prompt_ids"]  # left-padded
        assert t["responses"][i, :lr].tolist() == tr["response_ids"]  # right-padded
        assert t["response_mask"][i, :lr].tolist() == tr["loss_mask"] and t["response_mask"][i, lr:].sum() == 0
        assert t["attention_mask"][i].sum() == lp + lr
        assert t["position_ids"][i, P - lp] == 0 and t["position_ids"][i, P + lr - 1] == lp + lr - 1
        assert np.allclose(t["rollout_log_probs"][i, :lr],
                           [x if m else 0.0 for x, m in zip(tr["response_logprobs"], tr["loss_mask"])])
        last = max(j for j, m in enumerate(tr["loss_mask"]) if m)
        assert t["token_level_scores"][i].sum() == pytest.approx(traj["reward"])
        assert t["token_level_scores"][i, last] == pytest.approx(traj["reward"])
    outs = agent_loop_outputs(g1)
    assert [o["response_ids"] for o in outs] == [t_["traces"][0]["response_ids"] for t_ in g1["trajectories"]]
    assert all(o["metrics"]["policy_version"] == 3 for o in outs)
