"""The directory form of an image, for the bwrap runtime (no engine): what `polar-mq image build
--backend bwrap` writes and `runtimes/bwrap.py` starts a session in.

An image directory holds `image.json`:
    {"format": 1, "name": "sweb.eval.x86_64.<id>:latest", "base_rootfs": "/abs/rootfs dir",
     "workdir": "/testbed", "env": {"PATH": ...}, "binds": [["/host/path", "/path/inside"], ...],
     "labels": {...}}
and `testbed/`, the repository as the session starts with it (copied into the session's work dir,
which the sandbox sees at `workdir`; a fresh runtime for grading gets a fresh copy). The base
rootfs is shared read-only by every image built on it; `binds` (read-only) add layers such as the
harness CLI. `runtime.image` names such a directory by its path, or by name in the image store
`$POLAR_ROOTFS_DIR` (default ~/.cache/polar_mq/rootfs), where the name's ':' is written '__'
(swebench's file-safe form). Guarded by tests/runtimes/test_instance_images.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_FILE = "image.json"
FORMAT = 1


def store_dir() -> Path:
    env = os.environ.get("POLAR_ROOTFS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "polar_mq" / "rootfs"


def filesafe(name: str) -> str:
    """An image name as a directory name (`sweb.eval.x86_64.x:latest` → `sweb.eval.x86_64.x__latest`)."""
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name.replace("/", "_").replace(":", "__")


@dataclass
class RootfsImage:
    path: Path
    name: str
    base_rootfs: Path
    workdir: str = "/testbed"
    env: dict[str, str] = field(default_factory=dict)
    binds: list[tuple[str, str]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def testbed(self) -> Path:
        return self.path / "testbed"

    def to_json(self) -> dict:
        return {"format": FORMAT, "name": self.name, "base_rootfs": str(self.base_rootfs), "workdir": self.workdir,
                "env": self.env, "binds": [list(b) for b in self.binds], "labels": self.labels}


def load(path: str | Path) -> RootfsImage:
    path = Path(path)
    try:
        data = json.loads((path / IMAGE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a rootfs image ({IMAGE_FILE}: {exc})") from exc
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown rootfs image format {data.get('format')!r}")
    base = Path(data["base_rootfs"])
    if not (base / "usr").is_dir():
        raise ValueError(f"{path}: its base rootfs {base} is missing")
    return RootfsImage(path=path.resolve(), name=data.get("name") or path.name, base_rootfs=base,
                       workdir=data.get("workdir") or "/testbed", env=dict(data.get("env") or {}),
                       binds=[(str(s), str(d)) for s, d in data.get("binds") or []],
                       labels=dict(data.get("labels") or {}))


def resolve(image: str) -> RootfsImage | None:
    """The rootfs image `image` names (a directory path, or a name in the store), else None."""
    if not image:
        return None
    p = Path(image).expanduser()
    if p.is_absolute() and (p / IMAGE_FILE).is_file():
        return load(p)
    cand = store_dir() / filesafe(image)
    if (cand / IMAGE_FILE).is_file():
        return load(cand)
    return None


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def root_args(base: Path, mounted: list[str], dst: str = "/") -> list[str]:
    """bwrap arguments that lay `base` out as the sandbox's root, read-only, leaving room for the
    paths in `mounted` (bound later by the caller): a directory on the way to one of them is made
    in bwrap's own tmpfs root and its other entries are bound one by one, so no mount point is ever
    created inside the read-only base (bwrap < 0.9 has no overlays)."""
    args: list[str] = []
    for entry in sorted(os.listdir(base)):
        src = base / entry
        path = os.path.join(dst, entry)
        if any(_under(path, m) for m in mounted):
            continue  # bound by the caller
        if os.path.islink(src):
            args += ["--symlink", os.readlink(src), path]
        elif src.is_dir() and any(_under(m, path) for m in mounted):
            args += ["--dir", path] + root_args(src, mounted, path)
        else:
            args += ["--ro-bind", str(src), path]
    return args
