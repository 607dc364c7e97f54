"""`polar-mq image base|build`: images for SWE-bench / SWE-Gym rows, made here without a registry
(polar_mq/runtimes/images/, docs/swegym.md).

    polar-mq image base --out DIR [--python PATH] [--package NAME]... [--no-node] [--import]
    polar-mq image build --dataset ROWS --repo-dir PATH (--base-rootfs DIR | --base-image NAME)
                         [--backend docker|bwrap] [--harness NAME] [--out DIR] [--tag TAG]
                         [--limit N] [--force]

`build` prints one line per row on stdout, `IMAGE built|cached`, in row order; a row that cannot
be built is reported on stderr with its row number. Exit 0 when every row has its image, 1 when
some rows failed, 2 when the dataset, the base or the engine cannot be used."""

from __future__ import annotations

import argparse
import sys


def add_command(sub: argparse._SubParsersAction) -> None:
    img = sub.add_parser("image", help="build per-instance images of SWE-bench / SWE-Gym rows locally")
    isub = img.add_subparsers(dest="image_command", required=True)

    base = isub.add_parser("base", help="make a base root filesystem from this host's own files "
                                        "(python + test deps, git, coreutils, node)")
    base.add_argument("--out", required=True, help="the rootfs directory (kept when its inputs are unchanged)")
    base.add_argument("--python", help="the interpreter to copy (default /usr/bin/python3)")
    base.add_argument("--package", action="append", dest="packages", metavar="NAME",
                      help="a Python distribution to copy with its requirements (repeatable; default pytest)")
    base.add_argument("--no-node", action="store_true", help="leave node out (no harness CLI can run on it)")
    base.add_argument("--import", action="store_true", dest="do_import",
                      help="also import it into the local Docker engine (prints the image name)")
    base.set_defaults(func=_base)

    build = isub.add_parser("build", help="build sweb.eval.x86_64.<instance_id> images for the rows of a dataset")
    build.add_argument("--dataset", required=True, help="JSONL / JSON / Parquet rows in SWE-bench / SWE-Gym shape")
    build.add_argument("--repo-dir", required=True,
                       help="a local git repository holding the rows' base commits, or a directory of "
                            "<owner>__<name> clones")
    build.add_argument("--base-rootfs", help="a base rootfs directory (polar-mq image base)")
    build.add_argument("--base-image", help="docker: an image the engine already has (nothing is pulled)")
    build.add_argument("--backend", choices=["docker", "bwrap"], default="docker",
                       help="docker: images in the local engine (default); bwrap: rootfs image directories")
    build.add_argument("--harness", default="shell",
                       help="the harness CLI to put in the images (its pinned package from the harness "
                            "cache; default shell: none)")
    build.add_argument("--out", help="bwrap: where the image directories go (default $POLAR_ROOTFS_DIR, "
                                     "else ~/.cache/polar_mq/rootfs)")
    build.add_argument("--tag", default="latest", help="the images' tag (default latest)")
    build.add_argument("--limit", type=int, help="only the first N rows")
    build.add_argument("--force", action="store_true", help="rebuild images that are up to date")
    build.set_defaults(func=_build)


def _base(args: argparse.Namespace) -> int:
    from polar_mq.runtimes.images.hostfs import RootfsError, make_base_rootfs

    try:
        manifest = make_base_rootfs(args.out, python=args.python, packages=args.packages or ["pytest"],
                                    node=not args.no_node)
    except RootfsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pkgs = " ".join(f"{k}=={v}" for k, v in sorted(manifest["packages"].items()))
    print(f"base rootfs {args.out}: digest {manifest['digest']}, python {manifest['python_version']}, {pkgs}"
          f"{', node' if manifest['node'] else ''}")
    if manifest.get("missing_commands"):
        print(f"not on this host, left out: {' '.join(manifest['missing_commands'])}", file=sys.stderr)
    if args.do_import:
        from polar_mq.runtimes.images.build import ImageBuildError, import_base

        try:
            print(import_base(_client(), args.out))
        except (ImageBuildError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def _client():
    try:
        from polar_mq.runtimes.docker import docker_client

        client = docker_client(timeout=1800)
        client.ping()
        return client
    except Exception as exc:  # noqa: BLE001 - no SDK, no engine, no permission
        raise RuntimeError(f"the docker backend needs a local Docker engine (DOCKER_HOST): {exc}") from exc


def _build(args: argparse.Namespace) -> int:
    from polar_mq.rl.datasets import DatasetError, load_rows
    from polar_mq.runtimes.images.build import ARCH, ImageBuildError, build_images, harness_layer, import_base

    if args.backend == "bwrap" and not args.base_rootfs:
        print("error: --backend bwrap needs --base-rootfs DIR (polar-mq image base --out DIR)", file=sys.stderr)
        return 2
    if args.backend == "docker" and bool(args.base_rootfs) == bool(args.base_image):
        print("error: give one of --base-rootfs DIR or --base-image NAME", file=sys.stderr)
        return 2
    try:
        rows = load_rows(args.dataset)
        harness = harness_layer(args.harness)
    except (DatasetError, ImageBuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit is not None:
        rows = rows[: max(0, args.limit)]
    client, base_image = None, args.base_image
    if args.backend == "docker":
        try:
            client = _client()
            if args.base_rootfs:
                base_image = import_base(client, args.base_rootfs)
        except (ImageBuildError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    built = build_images(((r.number, r.data, r.error) for r in rows), backend=args.backend,
                         repo_dir=args.repo_dir, harness=harness, client=client, base_image=base_image,
                         base_rootfs=args.base_rootfs, out=args.out, tag=args.tag, force=args.force)
    errors = 0
    for b in built:
        if b.status == "error":
            errors += 1
            print(f"row {b.row}: {b.instance_id or '?'}: {b.detail}", file=sys.stderr)
        else:
            print(f"{b.image} {b.status}", flush=True)
    ok = len(built) - errors
    print(f"{len(built)} row(s): {ok} image(s) ready ({args.backend}), {errors} failed; submit them with "
          f"--image-template 'sweb.eval.{ARCH}.{{instance_id_lower}}:{args.tag}'", file=sys.stderr)
    return 1 if errors else 0
