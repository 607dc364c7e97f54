"""Per-instance images of SWE-bench / SWE-Gym rows, built here: `polar-mq image build`.

For each row: the repository at `/testbed`, checked out at the row's `base_commit` (fetched from a
local clone, so the commit keeps its sha and its history up to there, nothing after it), on a base
that has Python, the test dependencies and the tools the graders use (`hostfs.make_base_rootfs`,
or any image the engine already has), plus the harness CLI: the pinned npm package from the
harness cache at `/opt/polar/harnesses/<name>-<version>` with its `node_modules/.bin` on PATH
(the base brings node). Named as swebench names instance images, `sweb.eval.x86_64.<instance_id>:<tag>`
(lower case), so `polar-mq submit --dataset ROWS --image-template 'sweb.eval.x86_64.{instance_id_raw}:latest'`
finds them.

- docker: `FROM <base>` + COPY, built with the local engine and never pulling; the base rootfs
  is `docker import`ed once (tagged by its digest). An image whose `polar_mq.image_digest` label
  matches what it would be built from (base image id, commit, harness) is kept, not rebuilt.
- bwrap: a directory per image in the rootfs image store (layout.py): `image.json` + `testbed/`,
  on the base rootfs directory; the harness layer is bound from the cache, not copied.

Guarded by tests/runtimes/test_instance_images.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from polar_mq.runtimes.images import layout
from polar_mq.runtimes.images.hostfs import copy_paths, elf_files, library_closure, read_manifest, tar_rootfs

FORMAT = 1
ARCH = "x86_64"
HARNESS_ROOT = "/opt/polar/harnesses"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_REPO = "polar-base"
DIGEST_LABEL = "polar_mq.image_digest"


class ImageBuildError(RuntimeError):
    """One image cannot be built (the message says why, in the caller's terms)."""


@dataclass
class Built:
    row: int
    instance_id: str
    image: str
    status: str  # built | cached | error
    detail: str = ""


def instance_image_name(instance_id: str, tag: str = "latest") -> str:
    """swebench's name of an instance image built locally (image_builder.ImageSpec.name without a
    namespace): `sweb.eval.x86_64.<instance_id>:<tag>`, lower case."""
    return f"sweb.eval.{ARCH}.{instance_id}:{tag}".lower()


@dataclass
class HarnessLayer:
    name: str
    source: Path | None  # the installed package dir in the harness cache; None: nothing to add
    dirname: str = ""
    bin: str = ""

    @property
    def path_inside(self) -> str:
        return f"{HARNESS_ROOT}/{self.dirname}" if self.dirname else ""

    def env(self) -> dict[str, str]:
        if not self.dirname:
            return {"PATH": SYSTEM_PATH}
        return {"PATH": f"{self.path_inside}/node_modules/.bin:{SYSTEM_PATH}"}


def harness_layer(name: str | None, cache_dir: os.PathLike | None = None) -> HarnessLayer:
    """The pinned CLI of harness `name` from the harness cache (`polar-mq harness install NAME`);
    `shell` (or none) adds nothing."""
    if not name or name == "shell":
        return HarnessLayer(name or "", None)
    from polar_mq.harnesses.install import PACKAGES, install_dir, is_installed

    if name not in PACKAGES:
        raise ImageBuildError(f"unknown harness {name!r} (known: shell, {', '.join(sorted(PACKAGES))})")
    if not is_installed(name, cache_dir):
        raise ImageBuildError(f"harness {name!r} is not installed in the harness cache: "
                              f"polar-mq harness install {name}")
    pkg = PACKAGES[name]
    return HarnessLayer(name, install_dir(name, cache_dir).resolve(), pkg.dirname, pkg.bin)


def harness_libraries(harness: HarnessLayer, base_rootfs: str | Path | None) -> list[str]:
    """Host shared libraries the harness layer's native files load that the base lacks (all of
    them when the base is an engine image whose files are not known here)."""
    if harness.source is None:
        return []
    libs = library_closure(elf_files(harness.source))
    if base_rootfs is None:
        return libs
    base = Path(base_rootfs)
    return [p for p in libs if not os.path.lexists(base / p.lstrip("/"))]


def find_repo(repo_dir: str | Path, row: dict[str, Any]) -> Path:
    """The local clone holding the row's commit: `repo_dir` itself when it is a git repository,
    else `repo_dir/<owner>__<name>` (the row's `repo`, as SWE-bench names repositories on disk)."""
    root = Path(repo_dir).expanduser().resolve()
    if (root / ".git").exists() or (root / "objects").is_dir() and (root / "HEAD").is_file():
        return root
    cand = root / str(row.get("repo") or "").replace("/", "__")
    if (cand / ".git").exists():
        return cand
    raise ImageBuildError(f"no git repository for {row.get('repo')!r}: {root} is not one and holds no "
                          f"{cand.name}/")


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise ImageBuildError(f"git {' '.join(args[:3])}: {out.stderr.strip()[-400:]}")
    return out.stdout


def prepare_testbed(source: Path, commit: str, dst: Path) -> None:
    """`dst` = a repository checked out at `commit` (its sha and history up to it; no remote, no
    later commits, no other branches or tags)."""
    dst.mkdir(parents=True)
    _git(dst, "init", "-q")
    _git(dst, "fetch", "-q", "--no-tags", "--upload-pack",
         "git -c uploadpack.allowAnySHA1InWant=true upload-pack", str(source), commit)
    _git(dst, "checkout", "-q", "--detach", commit)
    head = _git(dst, "rev-parse", "HEAD").strip()
    if not head.startswith(commit) and head != commit:
        raise ImageBuildError(f"checked out {head}, not {commit}")
    for ref in ("FETCH_HEAD", "ORIG_HEAD"):
        (dst / ".git" / ref).unlink(missing_ok=True)


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([FORMAT, *parts], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _labels(row: dict[str, Any], harness: HarnessLayer, digest: str) -> dict[str, str]:
    return {"polar_mq.instance_id": str(row["instance_id"]), "polar_mq.repo": str(row.get("repo") or ""),
            "polar_mq.base_commit": str(row["base_commit"]), "polar_mq.harness": harness.dirname or harness.name,
            DIGEST_LABEL: digest}


# ---- docker ---------------------------------------------------------------------------------------
def import_base(client: Any, rootfs: str | Path) -> str:
    """The base rootfs directory as an engine image (`polar-base:<digest>`), imported once."""
    from docker.errors import ImageNotFound

    manifest = read_manifest(rootfs)
    if manifest is None:
        raise ImageBuildError(f"{rootfs} is not a base rootfs (polar-mq image base --out DIR makes one)")
    name = f"{BASE_REPO}:{manifest['digest']}"
    try:
        client.images.get(name)
        return name
    except ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="polar-base-") as tmp:
        tar = tar_rootfs(rootfs, Path(tmp) / "rootfs.tar")
        client.api.import_image(src=str(tar), repository=BASE_REPO, tag=manifest["digest"],
                                changes=[f"ENV PATH={SYSTEM_PATH}", "ENV LANG=C.UTF-8", "WORKDIR /"])
    client.images.get(name)
    return name


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def build_docker_image(client: Any, row: dict[str, Any], *, repo_dir: str | Path, base_image: str,
                       harness: HarnessLayer, tag: str = "latest", force: bool = False,
                       base_rootfs: str | Path | None = None) -> tuple[str, str]:
    """(image name, "built" | "cached") for one row; `base_rootfs`: the directory `base_image` was
    imported from, when it was (the harness's libraries it already has are not added)."""
    from docker.errors import BuildError, ImageNotFound

    name = instance_image_name(row["instance_id"], tag)
    try:
        base_id = client.images.get(base_image).id
    except ImageNotFound as exc:
        raise ImageBuildError(f"base image {base_image!r} is not present in the local Docker engine (nothing is "
                              "pulled): make one with `polar-mq image base --out DIR` and pass --base-rootfs DIR") \
            from exc
    digest = _digest(base_id, row["instance_id"], row.get("repo"), row["base_commit"], harness.dirname)
    if not force:
        try:
            if (client.images.get(name).labels or {}).get(DIGEST_LABEL) == digest:
                return name, "cached"
        except ImageNotFound:
            pass
    source = find_repo(repo_dir, row)
    with tempfile.TemporaryDirectory(prefix="polar-img-") as tmp:
        ctx = Path(tmp)
        prepare_testbed(source, row["base_commit"], ctx / "testbed")
        lines = [f"FROM {base_image}", "COPY testbed /testbed"]
        if harness.source is not None:
            shutil.copytree(harness.source, ctx / "harness", symlinks=True, copy_function=_link_or_copy)
            lines.append(f"COPY harness {harness.path_inside}")
            libs = harness_libraries(harness, base_rootfs)
            if libs:  # the CLI's native parts run on the image's loader: their libraries come along
                copy_paths(ctx / "hostlibs", libs)
                lines.append("COPY hostlibs/ /")
        lines += [f"ENV {k}={v}" for k, v in harness.env().items()]
        lines += ["WORKDIR /testbed"]
        lines += [f"LABEL {k}={json.dumps(v)}" for k, v in _labels(row, harness, digest).items()]
        (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
        try:
            client.images.build(path=str(ctx), tag=name, pull=False, rm=True, forcerm=True, timeout=1800)
        except BuildError as exc:
            log = [str(c.get("stream") or c.get("error") or "").strip() for c in exc.build_log]
            raise ImageBuildError(f"docker build failed: {exc.msg}; {' | '.join(x for x in log if x)[-600:]}") \
                from exc
    return name, "built"


# ---- bwrap: rootfs image directories ---------------------------------------------------------
def build_rootfs_image(row: dict[str, Any], *, repo_dir: str | Path, base_rootfs: str | Path,
                       harness: HarnessLayer, out: str | Path | None = None, tag: str = "latest",
                       force: bool = False) -> tuple[str, str]:
    """(image name, "built" | "cached") for one row, as a directory in `out` (default: the store)."""
    base = Path(base_rootfs).resolve()
    manifest = read_manifest(base)
    if manifest is None:
        raise ImageBuildError(f"{base} is not a base rootfs (polar-mq image base --out DIR makes one)")
    name = instance_image_name(row["instance_id"], tag)
    store = Path(out).expanduser().resolve() if out else layout.store_dir()
    dst = store / layout.filesafe(name)
    digest = _digest(manifest["digest"], str(base), row["instance_id"], row.get("repo"), row["base_commit"],
                     harness.dirname, str(harness.source or ""))
    if not force and (dst / layout.IMAGE_FILE).is_file():
        try:
            if layout.load(dst).labels.get(DIGEST_LABEL) == digest:
                return name, "cached"
        except ValueError:
            pass
    source = find_repo(repo_dir, row)
    store.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=store))
    try:
        prepare_testbed(source, row["base_commit"], tmp / "testbed")
        binds = [(str(harness.source), harness.path_inside)] if harness.source is not None else []
        binds += [(os.path.realpath(p), p) for p in harness_libraries(harness, base)]
        img = layout.RootfsImage(path=dst, name=name, base_rootfs=base, workdir="/testbed", env=harness.env(),
                                 binds=binds, labels=_labels(row, harness, digest))
        (tmp / layout.IMAGE_FILE).write_text(json.dumps(img.to_json(), indent=1, sort_keys=True))
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return name, "built"


def build_images(rows: Iterable[tuple[int, dict[str, Any] | None, str | None]], *, backend: str,
                 repo_dir: str | Path, harness: HarnessLayer, client: Any = None, base_image: str | None = None,
                 base_rootfs: str | Path | None = None, out: str | Path | None = None, tag: str = "latest",
                 force: bool = False) -> list[Built]:
    """One Built per (row number, row or None, row error); a row that fails never stops the others."""
    out_list: list[Built] = []
    for number, row, error in rows:
        iid = str((row or {}).get("instance_id") or "")
        if row is None or error:
            out_list.append(Built(number, iid, "", "error", error or "empty row"))
            continue
        missing = [k for k in ("instance_id", "base_commit") if not row.get(k)]
        if missing:
            out_list.append(Built(number, iid, "", "error", f"row without {', '.join(missing)}"))
            continue
        try:
            if backend == "docker":
                name, status = build_docker_image(client, row, repo_dir=repo_dir, base_image=str(base_image),
                                                  harness=harness, tag=tag, force=force, base_rootfs=base_rootfs)
            else:
                name, status = build_rootfs_image(row, repo_dir=repo_dir, base_rootfs=str(base_rootfs),
                                                  harness=harness, out=out, tag=tag, force=force)
            out_list.append(Built(number, iid, name, status))
        except ImageBuildError as exc:
            out_list.append(Built(number, iid, instance_image_name(iid, tag), "error", str(exc)))
    return out_list
