"""The GRPO example's parts that need no vLLM: the reward's checks in the test_runner's line
format, the balanced row order, and the two reward-rising criteria on known curves. The run
itself (real vLLM, the pipeline, the trainer, weight sync; the mean reward must rise beyond
noise) is tests/vllm/test_grpo_vllm.py, on the session's shared vLLM server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from polar_mq.graders.parsing import parse_lines  # noqa: E402

CHECK = ROOT / "examples" / "grpo" / "check_cursor.py"


@pytest.mark.parametrize("moves,target,expected", [
    (["left"], "left", {"test_cursor_moved": "PASSED", "test_cursor_at_target": "PASSED", "test_moves_in_order": "PASSED"}),
    (["up"], "down", {"test_cursor_moved": "PASSED", "test_cursor_at_target": "FAILED", "test_moves_in_order": "FAILED"}),
    (None, "up", {"test_cursor_moved": "FAILED", "test_cursor_at_target": "FAILED", "test_moves_in_order": "FAILED"}),
    # multi-turn: every move, in order (the same end cell reached in another order fails)
    (["up", "left", "up"], "up,left,up",
     {"test_cursor_moved": "PASSED", "test_cursor_at_target": "PASSED", "test_moves_in_order": "PASSED"}),
    (["left", "up", "up"], "up,left,up",
     {"test_cursor_moved": "PASSED", "test_cursor_at_target": "PASSED", "test_moves_in_order": "FAILED"}),
    (["up", "left"], "up,left,up",
     {"test_cursor_moved": "PASSED", "test_cursor_at_target": "FAILED", "test_moves_in_order": "FAILED"}),
])
def test_cursor_check_speaks_the_test_runner_line_format(tmp_path, moves, target, expected):
    """The reward's checks, parsed by the test_runner's own parser (its lines are `STATUS name`:
    printed the other way round they parsed as no tests at all, and every reward was 0)."""
    if moves is not None:
        from examples.grpo.task import START, STEP
        x, y = START
        for m in moves:
            x, y = x + STEP[m][0], y + STEP[m][1]
        (tmp_path / "cursor.json").write_text(json.dumps({"x": x, "y": y, "moves": moves}))
    r = subprocess.run([sys.executable, str(CHECK)], cwd=tmp_path, env={**os.environ, "TARGET": target},
                       capture_output=True, text=True, timeout=60)
    assert parse_lines(r.stdout) == expected
    assert r.returncode == (0 if set(expected.values()) == {"PASSED"} else 1)


def test_every_step_of_four_prompts_asks_each_direction_once():
    """The demo's step k takes rows k*4 .. k*4+3: each such slice names every direction once (a
    batch of one favourite direction teaches GRPO the marginal, not the reading), the rows come
    in a seeded order, and the target is the direction the instruction names."""
    from examples.grpo.task import DIRECTIONS, rows

    for step in range(12):
        batch = rows(4, seed=3, offset=step * 4)
        assert sorted(r["metadata"]["target"] for r in batch) == sorted(DIRECTIONS)
        for r in batch:
            assert f" {r['metadata']['target']}" in f" {r['instruction']}"
    assert rows(8, seed=3) == rows(8, seed=3) != rows(8, seed=4)


def test_multi_turn_rows_are_the_same_stream_k_instructions_at_a_time():
    """task.rows(turns=K): K instructions per row, one per line, with the K directions comma-joined
    in metadata.target; the single-turn rows are unchanged (the tuned CI run keeps its prompts)."""
    from examples.grpo.task import rows, targets

    single = rows(12, seed=5)
    multi = rows(4, seed=5, turns=3)
    assert [r["instruction"] for r in multi] == ["\n".join(r["instruction"] for r in single[i * 3:i * 3 + 3])
                                                 for i in range(4)]
    assert [targets(r["metadata"]["target"]) for r in multi] == [
        [r["metadata"]["target"] for r in single[i * 3:i * 3 + 3]] for i in range(4)]
    assert rows(2, seed=5, offset=1, turns=3) == multi[1:3]
    with pytest.raises(ValueError):
        targets("up,sideways")


def test_summary_lines_are_the_contracts():
    """CONTRACT (Additions, turn 3): the last lines of examples.grpo.run and examples.grpo.ablation."""
    from examples.grpo.ablation import summary_line as ablation_line
    from examples.grpo.report import summary_line

    rows = [{"mean_reward": r} for r in (0.25, 0.5, 0.75, 0.875)]
    assert summary_line(rows, 3, harness="shell", trainer="polar", builder="per_request")[2] == (
        "rl-demo: harness shell, trainer polar, builder per_request, mean reward 0.25 -> 0.81 over 4 steps (seed 3)")
    t = {"per_request": {"sequences": 288, "train_s": 12.34}, "prefix_merging": {"sequences": 96, "train_s": 4.0}}
    assert ablation_line(t) == ("ablation: per_request 288 sequences 12.3 s; prefix_merging 96 sequences 4.0 s; "
                                "3.00x fewer sequences, 3.08x faster trainer")


@pytest.mark.parametrize("argv,reason", [
    (["--harness", "codex", "--trainer", "trl", "--builder", "per_request"], "trainer trl"),
    (["--harness", "codex", "--turns", "3"], "harness codex"),
    (["--harness", "claude_code", "--turns", "3"], "harness claude_code"),
    (["--harness", "shell", "--trainer", "trl", "--builder", "per_request", "--turns", "3"], "trainer trl"),
])
def test_the_paths_not_built_stop_with_their_reason(tmp_path, argv, reason):
    """A harness or trainer without its base policy / wiring stops before any work with the reason,
    instead of running a loop whose reward is 0 by construction."""
    r = subprocess.run([sys.executable, "-m", "examples.grpo.run", *argv, "--out", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and reason in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_trend_criterion_tells_a_rise_from_noise():
    """report.trend_beyond_noise (the CI test's assertion): a real rise passes, a flat or noisy
    curve and a falling one do not, a rise too small to matter (< 0.2 fitted) does not."""
    from examples.grpo.report import rise_beyond_noise, trend_beyond_noise

    n = 32
    assert trend_beyond_noise([0.28, 0.44, 0.62, 0.75], n)["passed"]
    assert not trend_beyond_noise([0.31, 0.25, 0.38, 0.28], n)["passed"]        # flat, noisy
    assert not trend_beyond_noise([0.75, 0.62, 0.44, 0.28], n)["passed"]        # falling
    assert not trend_beyond_noise([0.47, 0.34, 0.75, 0.53], n)["passed"]        # z 1.5: not beyond noise
    small = trend_beyond_noise([0.30, 0.33, 0.36, 0.39], 10_000)                # certain, but tiny
    assert small["z"] > 2 and not small["passed"]
    v = trend_beyond_noise([0.2, 0.4, 0.6, 0.8], n)
    assert abs(v["slope"] - 0.2) < 1e-9 and abs(v["fitted_rise"] - 0.6) < 1e-9
    # the first-vs-last criterion (the demo-settings test): B = mean of the last two steps
    r = rise_beyond_noise([0.22, 0.47, 0.41, 0.50, 0.66, 0.88], n)
    assert r["passed"] and abs(r["last"] - 0.77) < 1e-9
    assert not rise_beyond_noise([0.44, 0.38, 0.56, 0.72], n)["passed"]          # +0.20 < 2 SE (0.22)


def test_ci_criterion_takes_a_rise_that_levels_off():
    """report.learnt (the CI test's assertion): the slope or the gain of the later steps over the
    first, each at z 2.3. A real CI run that rose at once and then levelled off failed the slope
    alone; flat, falling and noisy curves fail both."""
    from examples.grpo.report import gain_beyond_noise, learnt, trend_beyond_noise

    n = 32
    levelled = [0.3125, 0.6875, 0.7188, 0.4688, 0.6875]  # the CI run
    assert not trend_beyond_noise(levelled, n)["passed"] and learnt(levelled, n)["passed"]
    g = gain_beyond_noise(levelled, n)
    assert abs(g["gain"] - (0.640650 - 0.3125)) < 1e-4 and g["z"] > 3
    assert learnt([0.28, 0.44, 0.62, 0.75], n)["passed"]                          # steady rise
    for curve in ([0.31, 0.25, 0.38, 0.28, 0.34], [0.75, 0.62, 0.44, 0.28, 0.30],
                  [0.47, 0.34, 0.75, 0.53, 0.41], [0.40, 0.52, 0.47, 0.55, 0.50]):  # flat, falling, noisy, +0.11
        assert not learnt(curve, n)["passed"], curve
    assert not gain_beyond_noise([0.30, 0.33, 0.36, 0.39], 10_000)["passed"]     # certain, but < 0.2


@pytest.mark.parametrize("move,reward", [("left", 1.0), ("up", 0.0)])
def test_the_cursor_grader_rewards_the_direction_its_task_names(tmp_path, move, reward):
    """The plug-in grader as postrun calls it: a GradeContext whose task carries metadata.target,
    the checks run in the session's workspace (a dict-shaped context here once left every real
    session of the loop at reward 0 with an error)."""
    from examples.grpo.grader import CursorGrader
    from examples.grpo.task import START, STEP
    from tests.support.grading import Session
    from polar_mq.graders.run import run_grading
    from polar_mq.model import Trajectory
    from polar_mq.taskspec import parse_task

    src = tmp_path / "src"
    src.mkdir()
    s = Session(tmp_path, src)
    x, y = START[0] + STEP[move][0], START[1] + STEP[move][1]
    (Path(s.handle.workdir) / "cursor.json").write_text(json.dumps({"x": x, "y": y, "moves": [move]}))
    task = parse_task({"instruction": "Move the cursor left.", "metadata": {"target": "left"},
                       "agent": {"harness": "shell", "options": {"command": "true"}}})
    grade = run_grading(f"{CursorGrader.__module__}:CursorGrader", {}, Trajectory(session_id=s.name),
                        s.context(task=task))
    assert grade.reward == reward, grade


def test_trl_rollout_refuses_part_of_a_session():
    """PolarRollout hands TRL one trace per sample: a one-trace session goes whole; a session of
    several traces is refused by default (training on its first trace only would drop the rest
    silently), or with multi_trace='main' gives the main trace and counts the dropped ones."""
    from polar_mq.rl.trainers.trl import PolarRollout

    def trace(n: int, role: str) -> dict:
        return {"prompt_ids": [1] * n, "response_ids": [2, 3], "response_logprobs": [-0.1, -0.2],
                "loss_mask": [1, 1], "metadata": {"role": role}}

    one = {"session_id": "s1", "status": "COMPLETED", "reward": 1.0, "traces": [trace(3, "main")]}
    many = {"session_id": "s2", "status": "COMPLETED", "reward": 0.0, "traces": [trace(3, "side"), trace(5, "main")]}
    out = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "polar_reward", "polar_session_id")}
    strict = PolarRollout(client=None, template={})
    strict._append(out, one)
    assert out["prompt_ids"] == [[1, 1, 1]] and out["env_mask"] == [[1, 1]] and out["polar_reward"] == [1.0]
    with pytest.raises(ValueError, match="s2 has 2 traces"):
        strict._append(out, many)
    main = PolarRollout(client=None, template={}, multi_trace="main")
    main._append(out, many)
    assert out["prompt_ids"][-1] == [1] * 5 and main.dropped_traces == 1
    with pytest.raises(ValueError):
        PolarRollout(client=None, template={}, multi_trace="first")


def test_viewer_links_pick_a_success_and_a_failure(tmp_path):
    """metrics.md names one successful (reward 1) and one failed (reward 0) sample's viewer page,
    each from the last step that has one; ERROR sessions (no reward) are never picked, and a
    kind no step had is said to be missing rather than linked wrongly."""
    from examples.grpo.report import sample_sessions, viewer_links, write_report
    from polar_mq.model import Group

    def group(task: str, graded: list[tuple[str, float | None, str]]) -> dict:
        return {"task_id": task, "trajectories": [{"session_id": sid, "task_id": task, "reward": r, "status": st}
                                                  for sid, r, st in graded]}

    step0 = [group("t0", [("s-b", 0.0, "COMPLETED"), ("s-a", 1.0, "COMPLETED")])]
    step1 = [group("t1", [("s-z", None, "ERROR"), ("s-y", 1.0, "COMPLETED"), ("s-x", 1.0, "COMPLETED")]),
             group("t2", [("s-w", 0.0, "ERROR"), ("s-v", 1.0, "COMPLETED")])]
    # the groups API's dicts (TRL's rollout) and the client's Group objects (the polar loop) alike
    assert sample_sessions(step1) == {"success": "s-v", "failure": None}
    assert sample_sessions([Group.from_dict(g) for g in step1]) == {"success": "s-v", "failure": None}
    assert sample_sessions(step0) == {"success": "s-a", "failure": "s-b"}

    rows = [{"step": k, "policy_version": k, "mean_reward": m, "pass_rate": m, "tokens_trained": 4, "rollout_s": 1.0,
             "train_s": 0.1, "sync_s": 0.1, "sync_downtime_s": 0.05, "wall_s": 1.2, "viewer_sessions": v}
            for k, (m, v) in enumerate([(0.5, sample_sessions(step0)), (0.75, sample_sessions(step1))])]
    links = viewer_links(rows, "http://127.0.0.1:8123/")
    assert links["success"] == {"session_id": "s-v", "step": 1, "policy_version": 1, "reward": 1.0,
                                "url": "http://127.0.0.1:8123/ui/sessions/s-v"}
    assert links["failure"]["session_id"] == "s-b" and links["failure"]["step"] == 0
    assert viewer_links(rows[1:], None)["failure"] is None

    write_report(tmp_path, rows, seed=0, api_url="http://127.0.0.1:8123", reopen="serve it again: polar-mq up")
    md = (tmp_path / "metrics.md").read_text()
    assert "successful sample (reward 1), step 1 (policy v1): http://127.0.0.1:8123/ui/sessions/s-v" in md
    assert "failed sample (reward 0), step 0 (policy v0): http://127.0.0.1:8123/ui/sessions/s-b" in md
    assert "serve it again" in md and "token=" not in md
    assert json.loads((tmp_path / "viewer.json").read_text()) == links
    assert json.loads((tmp_path / "summary.json").read_text())["viewer"] == links
    write_report(tmp_path, rows[1:], seed=0, api_url="http://127.0.0.1:8123")
    assert "failed sample (reward 0): none in this run" in (tmp_path / "metrics.md").read_text()


def test_trl_trunk_cache_is_exact():
    """--harness codex --trainer trl trains the LM head only; trl_loop.cache_frozen_trunk runs the
    frozen trunk once per batch instead of once per pass: the logits and the LM head's gradient
    are exactly those of the uncached model, a new batch is computed afresh, and a model whose
    trunk trains is refused."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from examples.grpo.trl_loop import cache_frozen_trunk

    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    plain, cached = Qwen2ForCausalLM(cfg), Qwen2ForCausalLM(cfg)
    cached.load_state_dict(plain.state_dict())
    for m in (plain, cached):
        for name, p in m.named_parameters():
            p.requires_grad_(name.startswith("lm_head."))
    with pytest.raises(ValueError):
        cache_frozen_trunk(Qwen2ForCausalLM(cfg))
    # as TRL's GRPOConfig sets it up (gradient_checkpointing defaults to True): the input embeddings
    # require grad, so an uncached trunk builds a graph a reused output would backpropagate twice
    for m in (plain, cached):
        m.train()
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.enable_input_require_grads()
    stats = cache_frozen_trunk(cached)
    ids = torch.randint(0, 64, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding, as TRL pads prompts
    for _ in range(3):  # TRL's passes over one batch
        for m in (plain, cached):
            m.zero_grad()
            out = m(input_ids=ids, attention_mask=mask, logits_to_keep=4)
            out.logits.log_softmax(-1)[..., 5].sum().backward()
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits, cached(input_ids=ids, attention_mask=mask).logits)
        assert torch.equal(plain.lm_head.weight.grad, cached.lm_head.weight.grad)
    assert stats == {"computed": 1, "reused": 5}
    other = torch.randint(0, 64, (3, 10))
    assert torch.equal(plain(input_ids=other).logits, cached(input_ids=other).logits)
    assert stats["computed"] == 2


def test_trl_scores_only_completion_positions_exactly():
    """trl_loop.score_completions_only: TRL's fused LM head gathers the completion positions on CPU
    too (instead of scoring the whole ~1k-token Codex prompt and masking it): the same per-token
    log-probs, entropies and LM-head gradient as scoring every position."""
    import torch
    import trl.trainer.utils as trl_utils
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from examples.grpo.trl_loop import score_completions_only

    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, 64, (3, 12))
    mask = torch.ones_like(ids)
    labels = ids.clone()
    labels[:, :-4] = -100  # only the completion is scored, as TRL labels it

    def scored():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        out.log_probs.sum().backward()
        return out.log_probs.detach(), out.entropy.detach(), model.lm_head.weight.grad.clone()

    original = trl_utils._use_triton
    try:
        every = scored()
        assert score_completions_only()
        compact = scored()
    finally:
        trl_utils._use_triton = original
    for a, b in zip(every, compact):
        assert torch.allclose(a, b, atol=1e-6)


def test_trl_lr_by_groups_scales_the_batch_and_keeps_the_schedule():
    """trl_loop.scale_lr (``--lr-by-groups``, codex's default, for TRL): the batch's first pass and
    its later passes run at lr x the informative fraction x the linear schedule's factor."""
    from types import SimpleNamespace

    import torch
    from transformers import get_linear_schedule_with_warmup

    from examples.grpo.trl_loop import scale_lr

    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w], lr=1e-2)
    sched = get_linear_schedule_with_warmup(opt, 0, 10)
    trainer = SimpleNamespace(optimizer=opt, lr_scheduler=SimpleNamespace(scheduler=sched))
    for _ in range(2):
        opt.step()
        sched.step()
    scale_lr(trainer, 1e-2, 0.25)  # one group of four differs
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25 * 0.8)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25 * 0.7)
    scale_lr(trainer, 1e-2, 1.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.7)
