"""bwrap in an image: a session whose `runtime.image` names a rootfs image directory
(runtimes/images/layout.py, made by `polar-mq image build --backend bwrap`) runs on that image's
base rootfs instead of the host's filesystem.

The sandbox's root is the base rootfs, read-only; the image's work dir (`/testbed`) is the
session's work dir, started as a copy of the image's `testbed/` (so a grader's fresh runtime from
the same image starts from the pristine repository again); /tmp is private; HOME and logs are the
session dir as always. From the host only what polar_mq itself needs inside is bound read-only at
its own path: the interpreter running polar_mq (its prefixes; the network bridge runs on it), the
polar_mq package directory, the harness cache (the pinned CLIs, as the docker runtime mounts it), and the
image's own binds (its harness layer). Nothing else of the host is visible, so no host path needs
hiding. Guarded by tests/runtimes/test_instance_images.py.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from polar_mq.model import RuntimeHandle
from polar_mq.runtimes.images.layout import RootfsImage, load, resolve, root_args
from polar_mq.taskspec import RuntimeSpec

EXTRA_KEY = "rootfs"  # RuntimeHandle.extra: the image directory this session runs in
HOST_LIBS = "/.polar-host-libs"  # where the bridge's host library dirs are bound (read-only)


def image_of(spec: RuntimeSpec) -> RootfsImage | None:
    """The rootfs image a task names, None when it names none. A named image that is not a
    rootfs image is an error: running it on the host's filesystem instead would not be that image."""
    if not spec.image:
        return None
    img = resolve(spec.image)
    if img is None:
        raise RuntimeError(f"bwrap: runtime.image {spec.image!r} is not a rootfs image directory here (build it "
                           f"with `polar-mq image build --backend bwrap`, or give the directory's path)")
    return img


def start_in_image(img: RootfsImage, spec: RuntimeSpec, handle: RuntimeHandle) -> RuntimeHandle:
    """The session's work dir filled from the image's testbed; the handle records the image."""
    work = Path(handle.workdir)
    if img.testbed.is_dir():
        shutil.copytree(img.testbed, work, symlinks=True, dirs_exist_ok=True)
    return handle.updated(cwd=spec.workdir or img.workdir, env={**img.env, **dict(spec.env)},
                          extra={**handle.extra, EXTRA_KEY: str(img.path)})


def host_paths() -> list[str]:
    """What polar_mq needs from the host inside an image sandbox, outermost paths only."""
    import polar_mq
    from polar_mq.harnesses.install import default_cache_dir

    # the package directory alone, not the checkout around it (which may hold a token file)
    cands = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, str(Path(polar_mq.__file__).resolve().parent))}
    cache = default_cache_dir()
    if cache.is_dir():
        cands.add(str(cache.resolve()))
    keep = sorted(p for p in cands if os.path.isdir(p))
    return [p for p in keep if not any(p != q and p.startswith(q + "/") for q in keep)]


def root_argv(handle: RuntimeHandle, bridge_dir: str) -> list[str] | None:
    """The bwrap arguments that make the sandbox's filesystem for a session in an image (root,
    /dev, /proc, /tmp, host paths, the image's binds), None for a session on the host's."""
    path = handle.extra.get(EXTRA_KEY)
    if not path:
        return None
    img = load(path)
    cwd = handle.cwd or handle.workdir
    hosts = host_paths()
    binds = [(s, d) for s, d in img.binds if os.path.exists(s)]
    mounted = ["/dev", "/proc", "/tmp", handle.session_dir, cwd, *hosts, *(d for _, d in binds)]
    argv = root_args(img.base_rootfs, mounted)
    argv += ["--dev-bind", "/dev", "/dev"] if handle.gpus else ["--dev", "/dev"]
    argv += ["--proc", "/proc", "--tmpfs", "/tmp"]
    for p in hosts:
        argv += ["--ro-bind", p, p]
    for src, dst in binds:
        argv += ["--ro-bind", src, dst]
    for i, d in enumerate(host_lib_dirs()):
        argv += ["--ro-bind", d, f"{HOST_LIBS}/{i}"]
    return argv


def bridge_python(handle: RuntimeHandle) -> list[str] | None:
    """The network bridge's command in an image sandbox: polar_mq imported from the checkout that
    runs here (bound in by host_paths), not from what the interpreter's site would find (an
    editable install's target is not bound), and without a PYTHONPATH the harness would inherit."""
    if not handle.extra.get(EXTRA_KEY):
        return None
    import polar_mq

    root = str(Path(polar_mq.__file__).resolve().parents[1])
    # The host interpreter's shared libraries come from the host's library dirs, bound at
    # HOST_LIBS; the loader reads LD_LIBRARY_PATH once at start, so it is dropped before the
    # bridge runs the harness command (which sees only the image's libraries).
    libs = ":".join(f"{HOST_LIBS}/{i}" for i in range(len(host_lib_dirs())))
    code = (f"import os, sys, runpy; os.environ.pop('LD_LIBRARY_PATH', None); sys.path.insert(0, {root!r}); "
            "runpy.run_module('polar_mq.runtimes.netbridge', run_name='__main__')")
    return ["env", f"LD_LIBRARY_PATH={libs}", sys.executable, "-c", code]


def host_lib_dirs() -> list[str]:
    """The host's shared-library directories (the dynamic linker's cache), for the bridge only."""
    import subprocess

    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return []
    dirs = {os.path.realpath(os.path.dirname(line.rsplit("=>", 1)[1].strip()))
            for line in out.splitlines() if "=>" in line}
    return sorted(d for d in dirs if os.path.isdir(d))
