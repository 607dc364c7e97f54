"""SWE-Gym-shaped tasks end to end, on images built here: the textkit example's rows
(examples/swegym, regenerated and compared with the checked-in rows.jsonl), `polar-mq image base`
(a rootfs from this host's own files), `polar-mq image build` (sweb.eval.x86_64.<id> images with
the repository at /testbed, in a private Docker engine and as bwrap rootfs directories), the rows
submitted with `polar-mq submit --dataset`, a scripted shell agent applying the gold patch to one
row and a wrong patch to the other, and the `swebench` grader in a fresh runtime of the same image:
gold -> 1, wrong -> 0. The session containers get no host mounts: python, pytest and git come from
the image. Needs swebench==5.0.2 (CI installs the extra)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from examples.swegym.make_rows import generate
from polar_mq import states
from polar_mq.graders.swebench import swebench_available
from polar_mq.runtimes.images.hostfs import make_base_rootfs
from tests.api.test_api import start_api
from tests.support.docker_engine import running_engine
from tests.support.pipeline import ROOT, running_pipeline
from tests.support.servers import stop

ROWS = ROOT / "examples" / "swegym" / "rows.jsonl"
BASE_CACHE = Path.home() / ".cache" / "polar_mq" / "images"


@pytest.fixture(scope="module")
def swegym(tmp_path_factory):
    """(the textkit git repository, rows.jsonl), generated now."""
    return generate(tmp_path_factory.mktemp("swegym"))


@pytest.fixture(scope="module")
def base_rootfs():
    """The base rootfs without node (the shell harness needs none), kept between runs by digest."""
    BASE_CACHE.mkdir(parents=True, exist_ok=True)
    out = BASE_CACHE / "test-base-nonode"
    make_base_rootfs(out, node=False)
    return out


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polar_mq.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=timeout)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wrong_patch(repo: Path, row: dict) -> str:
    """Instance 2's gold patch plus a change that breaks a PASS_TO_PASS test (format_duration(0))."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(work), row["base_commit"]], cwd=repo,
                       check=True)
        subprocess.run(["git", "apply", "-"], input=row["patch"], text=True, cwd=work, check=True)
        f = work / "textkit" / "durations.py"
        f.write_text(f.read_text().replace('return "0s"', 'return ""'))
        diff = subprocess.run(["git", "diff"], cwd=work, capture_output=True, text=True, check=True).stdout
        subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=repo, check=True)
    return diff


def agent_command(patches: dict[str, str]) -> str:
    """A scripted agent (python3 of the image): applies the patch of the commit its instruction names."""
    blob = base64.b64encode(json.dumps(patches).encode()).decode()
    code = ("import base64,json,os,subprocess;"
            f"P=json.loads(base64.b64decode('{blob}'));"
            "I=os.environ['POLAR_INSTRUCTION'];"
            "[subprocess.run(['git','apply','-'],input=p.encode(),check=True) for c,p in P.items() if c in I]")
    return f'python3 -c "{code}"'


def test_rows_regenerate_identically_and_hold_swe_gym_fields(swegym):
    repo, rows_path = swegym
    assert rows_path.read_text() == ROWS.read_text()  # reproducible: fixed identities and dates
    rows = rows_of(rows_path)
    assert len(rows) == 6 and len({r["base_commit"] for r in rows}) == 6
    for row in rows:
        assert set(row) >= {"instance_id", "repo", "base_commit", "problem_statement", "test_patch", "patch",
                            "FAIL_TO_PASS", "PASS_TO_PASS", "version", "hints_text", "created_at"}
        assert isinstance(row["FAIL_TO_PASS"], str) and json.loads(row["FAIL_TO_PASS"])
        assert json.loads(row["PASS_TO_PASS"])  # every instance keeps green tests in its test files
        # a root commit: no ancestor holds the fix; the tag names the instance
        parents = subprocess.run(["git", "rev-list", "--parents", "-n1", row["base_commit"]], cwd=repo,
                                 capture_output=True, text=True, check=True).stdout.split()
        assert parents == [row["base_commit"]]
        assert "+def test_" in row["test_patch"] and "tests/" not in row["patch"]


@pytest.fixture(scope="module")
def two_rows(swegym, tmp_path_factory):
    """(rows.jsonl of instances 1 and 2, the agent's patches by base commit: 1 gold, 2 wrong)."""
    repo, rows_path = swegym
    rows = rows_of(rows_path)[:2]
    two = tmp_path_factory.mktemp("two") / "rows.jsonl"
    two.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return two, {rows[0]["base_commit"]: rows[0]["patch"], rows[1]["base_commit"]: wrong_patch(repo, rows[1])}


@pytest.fixture(scope="module")
def engine():
    yield from running_engine()


@pytest.fixture(scope="module")
def rootfs_store(tmp_path_factory):
    return tmp_path_factory.mktemp("rootfs-store")


@pytest.fixture(scope="module")
def pipeline(engine, gateway, rootfs_store, tmp_path_factory):
    # No POLAR_DOCKER_MOUNTS: the session containers see only their image (and the harness cache).
    yield from running_pipeline(gateway, tmp_path_factory, "swegym", init=1, run=2, postrun=2,
                                DOCKER_HOST=engine.host, POLAR_ROOTFS_DIR=str(rootfs_store))


@pytest.fixture(scope="module")
def api(pipeline, log_dir):
    server = start_api(log_dir, pipeline.redis_url, name="api-swegym")
    yield server
    stop(server.proc)


def run_rows(pipeline, api, tmp_path, rows_file: Path, backend: str, patches: dict[str, str],
             policy_version: int) -> dict[str, object]:
    template = tmp_path / f"{backend}.yaml"
    template.write_text(json.dumps({
        "num_samples": 1, "timeout_seconds": 180,
        "agent": {"harness": "shell", "options": {"command": agent_command(patches)}},
        "runtime": {"backend": backend, "workdir": "/testbed"},
        "grader": {"strategy": "swebench", "config": {"timeout": 120}}}))
    out = cli("submit", "--dataset", str(rows_file), "--template", str(template), "--api", api.url, "--token", "",
              "--image-template", "sweb.eval.x86_64.{instance_id_lower}:latest",
              "--policy-version", str(policy_version), timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    task_ids = out.stdout.split()
    store = pipeline.store
    sids = [sid for t in task_ids for sid in store.session_ids(t)]
    recs = pipeline.wait(sids, timeout=240)
    assert all(r.state == states.COMPLETED for r in recs), [(r.state, r.error) for r in recs]
    return {store.task_request(r.task_id).metadata["instance_id"]: store.get_trajectory(r.session_id)
            for r in recs}


def log_tail(grade: dict) -> str:
    path = (grade.get("metadata") or {}).get("log")
    return Path(path).read_text(errors="replace")[-3000:] if path and Path(path).is_file() else ""


def check_grades(trajs: dict, gold_id: str, wrong_id: str) -> None:
    gold, wrong = trajs[gold_id], trajs[wrong_id]
    g = gold.metadata["grade"]
    assert gold.reward == 1.0 and g["details"]["resolved"], (json.dumps(g["details"]), log_tail(g))
    assert g["details"]["tests_status"]["PASS_TO_PASS"]["failure"] == []
    w = wrong.metadata["grade"]
    assert wrong.reward == 0.0 and not w["details"]["resolved"], w
    ts = w["details"]["tests_status"]
    assert ts["FAIL_TO_PASS"]["failure"] == []  # the wrong patch fixes the issue...
    assert ts["PASS_TO_PASS"]["failure"] == ["tests/test_durations.py::test_format_zero"]  # ...and breaks this


@pytest.mark.skipif(swebench_available() != "5.0.2", reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")
def test_instance_images_docker_gold_resolves_wrong_does_not(swegym, two_rows, base_rootfs, engine, pipeline, api,
                                                             tmp_path, capsys, monkeypatch):
    repo, _ = swegym
    two, _patches = two_rows
    rows = rows_of(two)
    docker_env = {"DOCKER_HOST": engine.host}
    out = cli("image", "build", "--dataset", str(two), "--repo-dir", str(repo), "--base-rootfs", str(base_rootfs),
              env=docker_env)
    names = [f"sweb.eval.x86_64.{r['instance_id']}:latest" for r in rows]
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [f"{n} built" for n in names], out.stdout
    again = cli_here(capsys, monkeypatch, "image", "build", "--dataset", str(two), "--repo-dir", str(repo),
                     "--base-rootfs", str(base_rootfs), env=docker_env)
    assert again[0] == 0 and again[1].split("\n")[:2] == [f"{n} cached" for n in names], again
    code, _, err = cli_here(capsys, monkeypatch, "image", "build", "--dataset", str(two), "--repo-dir", str(repo),
                            "--base-image", "polar-not-here:1", "--limit", "1", env=docker_env)
    assert code == 1 and "'polar-not-here:1' is not present in the local Docker engine" in err, err
    image = engine.client().images.get(names[0])
    assert image.labels["polar_mq.base_commit"] == rows[0]["base_commit"]
    head = engine.client().containers.run(names[0], ["git", "rev-parse", "HEAD"], remove=True, network_mode="none")
    assert head.decode().strip() == rows[0]["base_commit"]  # /testbed at the base commit, sha kept

    patches = two_rows[1]
    trajs = run_rows(pipeline, api, tmp_path, two, "docker", patches, policy_version=1)
    check_grades(trajs, rows[0]["instance_id"], rows[1]["instance_id"])
    for traj in trajs.values():
        assert traj.metadata["grade"]["metadata"]["patch"]["applied"]
    assert engine.containers() == []  # session and fresh grading containers removed


@pytest.mark.skipif(swebench_available() != "5.0.2", reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")
def test_instance_images_bwrap_gold_resolves_wrong_does_not(swegym, two_rows, base_rootfs, pipeline, api, rootfs_store,
                                                             tmp_path):
    """The same two rows as rootfs image directories on the same base, run and graded under bwrap."""
    repo, _ = swegym
    two, patches = two_rows
    rows = rows_of(two)
    names = [f"sweb.eval.x86_64.{r['instance_id']}:latest" for r in rows]
    out = cli("image", "build", "--dataset", str(two), "--repo-dir", str(repo), "--base-rootfs", str(base_rootfs),
              "--backend", "bwrap", "--out", str(rootfs_store))
    assert out.returncode == 0 and out.stdout.split("\n")[:2] == [f"{n} built" for n in names], out
    trajs = run_rows(pipeline, api, tmp_path, two, "bwrap", patches, policy_version=2)
    check_grades(trajs, rows[0]["instance_id"], rows[1]["instance_id"])


def cli_here(capsys, monkeypatch, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`polar-mq ARGS` in this process (exit code, stdout, stderr): the cheap checks skip a start-up."""
    from polar_mq.cli.commands import main

    capsys.readouterr()
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_image_build_errors_are_clear(swegym, base_rootfs, tmp_path, capsys, monkeypatch):
    repo, rows_path = swegym
    build = ("image", "build", "--dataset", str(rows_path), "--limit", "1")
    code, _, err = cli_here(capsys, monkeypatch, *build, "--repo-dir", str(repo), "--backend", "bwrap")
    assert code == 2 and "--base-rootfs" in err
    code, _, err = cli_here(capsys, monkeypatch, *build, "--repo-dir", str(tmp_path), "--backend", "bwrap",
                            "--base-rootfs", str(base_rootfs), "--out", str(tmp_path / "s"))
    assert code == 1 and "row 1: polar-mq__textkit-1: no git repository" in err, err
    code, _, err = cli_here(capsys, monkeypatch, *build, "--repo-dir", str(repo), "--backend", "bwrap",
                            "--base-rootfs", str(tmp_path))
    assert code == 1 and "is not a base rootfs" in err, err
    code, _, err = cli_here(capsys, monkeypatch, *build, "--repo-dir", str(repo), "--harness", "nope",
                            "--base-image", "x")
    assert code == 2 and "unknown harness 'nope'" in err
    code, _, err = cli_here(capsys, monkeypatch, *build, "--repo-dir", str(repo), "--base-image", "x",
                            "--base-rootfs", str(base_rootfs))
    assert code == 2 and "one of --base-rootfs DIR or --base-image NAME" in err


@pytest.mark.full
@pytest.mark.skipif(swebench_available() != "5.0.2", reason="needs swebench==5.0.2: pip install 'polar_mq[swebench]'")
def test_every_row_is_resolved_by_its_gold_patch_in_docker(swegym, base_rootfs, engine, pipeline, api, tmp_path):
    repo, rows_path = swegym
    rows = rows_of(rows_path)
    out = cli("image", "build", "--dataset", str(rows_path), "--repo-dir", str(repo), "--base-rootfs",
              str(base_rootfs), env={"DOCKER_HOST": engine.host})
    assert out.returncode == 0 and len(out.stdout.split("\n")) >= 6, out
    trajs = run_rows(pipeline, api, tmp_path, rows_path, "docker", {r["base_commit"]: r["patch"] for r in rows},
                     policy_version=3)
    assert {iid: t.reward for iid, t in trajs.items()} == {r["instance_id"]: 1.0 for r in rows}


@pytest.mark.full
def test_an_image_with_a_real_cli_runs_it_without_host_mounts(swegym, engine, tmp_path):
    """`--harness claude_code` on a base with node: the pinned CLI answers inside the image alone."""
    from polar_mq.harnesses.install import PACKAGES, install

    install(["claude_code"])  # on first use, from npm (a no-op when the cache has it)
    repo, rows_path = swegym
    base = BASE_CACHE / "test-base-node"
    make_base_rootfs(base, node=True)
    out = cli("image", "build", "--dataset", str(rows_path), "--repo-dir", str(repo), "--base-rootfs", str(base),
              "--harness", "claude_code", "--limit", "1", "--tag", "claude", env={"DOCKER_HOST": engine.host})
    name = "sweb.eval.x86_64.polar-mq__textkit-1:claude"
    assert out.returncode == 0 and out.stdout.startswith(f"{name} built"), out
    pkg = PACKAGES["claude_code"]
    assert engine.client().images.get(name).labels["polar_mq.harness"] == pkg.dirname
    version = engine.client().containers.run(name, ["claude", "--version"], remove=True, network_mode="none",
                                             environment={"HOME": "/tmp"})
    assert pkg.version in version.decode(), version
    # the bwrap form: the CLI bound from the cache, its native libraries the base lacks bound too
    out = cli("image", "build", "--dataset", str(rows_path), "--repo-dir", str(repo), "--base-rootfs", str(base),
              "--harness", "claude_code", "--limit", "1", "--backend", "bwrap", "--out", str(tmp_path / "store"))
    assert out.returncode == 0, out
    from polar_mq.runtimes import get_runtime
    from polar_mq.taskspec import RuntimeSpec

    rt = get_runtime("bwrap")
    handle = rt.start(RuntimeSpec(backend="bwrap", image=str(tmp_path / "store" / "sweb.eval.x86_64.polar-mq__textkit-1__latest")),
                      tmp_path / "s", "s")
    res = rt.exec(handle, "claude --version && git rev-parse HEAD", env={}, timeout=120, log_path=tmp_path / "log")
    text = (tmp_path / "log").read_text()
    assert res.exit_code == 0 and pkg.version in text and rows_of(rows_path)[0]["base_commit"] in text, text


def test_auto_runs_a_rootfs_image_under_bwrap_where_no_engine_answers(swegym, base_rootfs, tmp_path, monkeypatch):
    from polar_mq.runtimes import NoIsolation, select_backend
    from polar_mq.runtimes.images.build import build_rootfs_image, harness_layer

    repo, rows_path = swegym
    row = rows_of(rows_path)[0]
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.setenv("POLAR_ROOTFS_DIR", str(tmp_path / "store"))
    name, status = build_rootfs_image(row, repo_dir=repo, base_rootfs=base_rootfs, harness=harness_layer("shell"))
    assert status == "built" and name == f"sweb.eval.x86_64.{row['instance_id']}:latest"
    assert select_backend(name) == "bwrap"
    with pytest.raises(NoIsolation, match="not run under bwrap on the host filesystem"):
        select_backend("sweb.eval.x86_64.not-built:latest")
    # in the image: its repository at /testbed; of the host only the package dir, not the checkout
    from polar_mq.runtimes import get_runtime
    from polar_mq.taskspec import RuntimeSpec

    rt = get_runtime("bwrap")
    handle = rt.start(RuntimeSpec(backend="bwrap", image=name), tmp_path / "s", "s")
    res = rt.exec(handle, f"git rev-parse HEAD; test -d {ROOT}/polar_mq && test ! -e {ROOT}/README.md && echo hidden",
                  env={}, timeout=60, log_path=tmp_path / "log")
    assert res.exit_code == 0 and (tmp_path / "log").read_text().split() == [row["base_commit"], "hidden"]
