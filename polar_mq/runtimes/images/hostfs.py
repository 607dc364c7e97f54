"""A minimal base root filesystem made from this host's own files (no debootstrap, no registry).

`make_base_rootfs(out)` copies, at their host paths: the shells and tools a session and the
graders use (bash, sh, coreutils, git, patch, grep, sed, ...), a Python interpreter with its
standard library (tests, idle and tkinter left out) and the pure-Python distributions named in
`packages` with their requirements (default: pytest), copied from the environment polar_mq runs
in into the interpreter's /usr/local site directory; optionally `node` (what the harness CLIs run
on). Every ELF file's shared libraries (`ldd`) come along, with the dynamic loader. Merged-/usr
symlinks (bin -> usr/bin ...) and a few /etc files make it a root a container or bubblewrap can
start in. The result is a directory (for bwrap) that `docker import` takes as a tarball
(`tar_rootfs`).

`.polar-rootfs.json` in the root records what went in and a digest of the inputs; the same
inputs on the same host give the same digest, so a caller can keep one base per digest
(`polar-mq image base`, tests/runtimes/test_instance_images.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Iterable

MANIFEST = ".polar-rootfs.json"
FORMAT = 1
COMMANDS = (
    "bash", "sh", "dash", "env", "cat", "ls", "cp", "mv", "rm", "mkdir", "rmdir", "mktemp", "sleep", "touch",
    "chmod", "chown", "ln", "head", "tail", "grep", "sed", "awk", "find", "xargs", "tr", "cut", "sort", "uniq",
    "wc", "dirname", "basename", "readlink", "realpath", "tar", "gzip", "base64", "diff", "cmp", "patch", "git",
    "id", "whoami", "uname", "date", "tee", "true", "false", "test", "printf", "echo", "kill", "which", "stat",
    "du", "df", "timeout", "nproc", "ps", "pwd", "expr", "seq", "md5sum", "sha256sum", "hostname", "less",
)
ETC_FILES = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "ld.so.conf", "ld.so.cache", "os-release",
             "debian_version")
# C++ runtime libraries: what binary wheels (numpy's among them) load besides libc; polar_mq's own
# network bridge runs in an image sandbox on the host's interpreter and imports them.
EXTRA_LIBS = ("libstdc++.so.6", "libgcc_s.so.1")
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "pydoc_data",
               "site-packages", "dist-packages"}
_LDD = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


class RootfsError(RuntimeError):
    """A base root filesystem cannot be made as asked."""


def default_python() -> str:
    """The system interpreter (a standard layout, shareable), else the one running polar_mq."""
    for cand in ("/usr/bin/python3",):
        if os.access(cand, os.X_OK):
            return cand
    return os.path.realpath(sys.executable)


def _probe(python: str) -> dict[str, str]:
    code = ("import json, sys, sysconfig; p = sysconfig.get_paths(); print(json.dumps({'stdlib': p['stdlib'], "
            "'platstdlib': p['platstdlib'], 'version': '%d.%d' % sys.version_info[:2], "
            "'dynload': sysconfig.get_config_var('DESTSHARED') or ''}))")
    out = subprocess.run([python, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RootfsError(f"{python} cannot run: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)


def _requirements(names: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions `names` and what they require (markers evaluated here), installed in the
    environment running polar_mq."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise RootfsError(f"package {name!r} is not installed where polar_mq runs (pip install {name})") from exc
        seen[key] = dist
        for req in dist.requires or []:
            name_ok = _required(req)
            if name_ok:
                todo.append(name_ok)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def _required(req: str) -> str | None:
    """The distribution a requirement line names when it applies here without extras, else None."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # packaging comes with pytest and pip's environments; without it: no markers
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        return m.group(1) if m and ";" not in req else None
    r = Requirement(req)
    return r.name if r.marker is None or r.marker.evaluate({"extra": ""}) else None


class _Copier:
    def __init__(self, root: Path):
        self.root = root
        self.done: set[str] = set()
        self.elves: set[str] = set()

    def path(self, src: str) -> None:
        """Copy host path `src` (a file, or a symlink and what it points to) to the same path."""
        src = os.path.normpath(src)
        if src in self.done or not os.path.lexists(src):
            return
        self.done.add(src)
        parent = os.path.dirname(src)
        if os.path.islink(parent) or parent != os.path.realpath(parent):
            self.path(parent)  # a symlinked directory on the way (lib64 -> usr/lib64)
            real = os.path.join(os.path.realpath(parent), os.path.basename(src))
            self.path(real)
            return
        dst = self.root / src.lstrip("/")
        if os.path.islink(src):
            target = os.readlink(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(dst):
                os.symlink(target, dst)
            self.path(os.path.join(parent, target) if not target.startswith("/") else target)
            return
        if os.path.isdir(src):
            dst.mkdir(parents=True, exist_ok=True)
            return
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        with open(src, "rb") as fh:
            if fh.read(4) == b"\x7fELF":
                self.elves.add(src)

    def tree(self, src: str, skip: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = [d for d in dirnames if d not in skip]
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                if not name.endswith((".pyc", ".pyo")):
                    self.path(os.path.join(dirpath, name))

    def libraries(self) -> None:
        """The shared libraries (and loader) of every ELF file copied, until none is missing."""
        checked: set[str] = set()
        while self.elves - checked:
            batch = sorted(self.elves - checked)
            checked.update(batch)
            for i in range(0, len(batch), 64):
                out = subprocess.run(["ldd", *batch[i:i + 64]], capture_output=True, text=True, timeout=120)
                for lib in _LDD.findall(out.stdout):
                    self.path(lib)


def elf_files(root: str | Path) -> list[str]:
    """ELF executables and shared objects under `root` (executable files, *.so*, *.node)."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p) or not (os.access(p, os.X_OK) or name.endswith((".node", ".so")) or ".so." in name):
                continue
            try:
                with open(p, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        out.append(p)
            except OSError:
                continue
    return sorted(out)


def library_closure(elves: Iterable[str]) -> list[str]:
    """The host shared libraries `elves` load, transitively, each at its path with the directory
    part resolved (`/lib/x86_64-linux-gnu/librt.so.1` -> `/usr/lib/x86_64-linux-gnu/librt.so.1` on
    a merged-/usr host), loader included. Files for another architecture load nothing here."""
    seen: set[str] = set()
    todo = sorted(set(elves))
    while todo:
        batch, todo = todo[:64], todo[64:]
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True, timeout=120)
        for lib in _LDD.findall(out.stdout):
            lib = os.path.join(os.path.realpath(os.path.dirname(lib)), os.path.basename(lib))
            if lib not in seen and os.path.exists(lib):
                seen.add(lib)
                todo.append(lib)
    return sorted(seen)


def copy_paths(root: str | Path, paths: Iterable[str]) -> None:
    """Host `paths` (and the files their symlinks name) into `root` at the same paths."""
    cp = _Copier(Path(root))
    for p in paths:
        cp.path(p)


def _ldconfig(soname: str) -> list[str]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return []
    found = [line.rsplit("=>", 1)[1].strip() for line in out.splitlines()
             if line.strip().startswith(soname + " ") and "=>" in line]
    return found[:1]  # the first is the native one


def inputs_digest(python: str, packages: Iterable[str], node: bool, commands: Iterable[str]) -> str:
    """A digest of what a base would be made of here (paths, sizes and mtimes of the sources)."""
    h = hashlib.sha256(json.dumps([FORMAT, python, sorted(packages), node, sorted(commands), EXTRA_LIBS]).encode())
    for cmd in sorted(set(commands) | {python} | ({"node"} if node else set())):
        p = shutil.which(cmd) or cmd
        if os.path.exists(p):
            st = os.stat(p)
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    for dist in _requirements(packages):
        h.update(f"{dist.metadata['Name']}=={dist.version}".encode())
    return h.hexdigest()[:16]


def read_manifest(root: str | Path) -> dict | None:
    try:
        return json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def make_base_rootfs(out: str | Path, *, python: str | None = None, packages: Iterable[str] = ("pytest",),
                     node: bool = True, commands: Iterable[str] = COMMANDS, reuse: bool = True) -> dict:
    """Make (or, with `reuse` and the same inputs digest, keep) the base rootfs at `out`; returns
    its manifest."""
    python = python or default_python()
    packages, commands = list(packages), list(commands)
    out = Path(out).resolve()
    digest = inputs_digest(python, packages, node, commands)
    old = read_manifest(out)
    if reuse and old and old.get("digest") == digest:
        return old
    if out.exists():
        if old is None and any(out.iterdir()):
            raise RootfsError(f"{out} exists and is not a polar_mq base rootfs; give an empty or new directory")
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = _probe(python)
    cp = _Copier(tmp)
    for d in ("usr/bin", "usr/lib", "usr/sbin", "etc", "root", "home", "proc", "sys", "dev", "run", "var/tmp",
              "opt", "testbed"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    (tmp / "tmp").mkdir(mode=0o1777)
    os.chmod(tmp / "tmp", 0o1777)
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink("/" + link):  # a merged-/usr host: the same links
            os.symlink(os.readlink("/" + link), tmp / link)
            (tmp / "usr" / link).mkdir(parents=True, exist_ok=True)
    missing = []
    for cmd in commands:
        where = shutil.which(cmd, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        if where:
            cp.path(where)
        else:
            missing.append(cmd)
    cp.path(python)
    real_python = os.path.realpath(python)
    cp.path(real_python)
    bindir = tmp / os.path.dirname(real_python).lstrip("/")
    for alias in ("python3", "python"):
        if not os.path.lexists(bindir / alias):
            os.symlink(os.path.basename(real_python), bindir / alias)
    cp.tree(info["stdlib"], SKIP_STDLIB)
    if info["platstdlib"] != info["stdlib"]:
        cp.tree(info["platstdlib"], SKIP_STDLIB)
    if info["dynload"] and os.path.isdir(info["dynload"]):
        cp.tree(info["dynload"])
    site = tmp / "usr" / "local" / "lib" / f"python{info['version']}" / "dist-packages"
    dists = _requirements(packages)
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        for f in dist.files or []:
            src = Path(str(dist.locate_file(f)))
            try:
                rel = src.resolve().relative_to(base.resolve())
            except ValueError:
                continue  # scripts and data outside site-packages
            if src.suffix in (".pyc", ".pyo") or not src.is_file():
                continue
            dst = site / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            if src.suffix == ".so":
                cp.elves.add(str(src))
    if node:
        where = shutil.which("node")
        if not where:
            raise RootfsError("node is not installed here (apt-get install nodejs), or make the base with node=False")
        cp.path(where)
    for lib in EXTRA_LIBS:
        for found in _ldconfig(lib):
            cp.path(found)
    for name in ETC_FILES:
        if os.path.isfile("/etc/" + name):
            shutil.copy2("/etc/" + name, tmp / "etc" / name)
    cp.libraries()
    manifest = {"format": FORMAT, "digest": digest, "python": real_python, "python_version": info["version"],
                "site_packages": "/" + str(site.relative_to(tmp)),
                "packages": {d.metadata["Name"]: d.version for d in dists}, "node": node,
                "commands": sorted(c for c in commands if c not in missing), "missing_commands": sorted(missing)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.rename(tmp, out)
    return manifest


def tar_rootfs(root: str | Path, dst: str | Path) -> Path:
    """`root` as an uncompressed tarball with root-relative names (what `docker import` takes);
    owners are root, as in any image."""
    root, dst = Path(root), Path(dst)

    def owner(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        return ti

    with tarfile.open(dst, "w") as tar:
        for entry in sorted(os.listdir(root)):
            tar.add(str(root / entry), arcname=entry, filter=owner)
    return dst
