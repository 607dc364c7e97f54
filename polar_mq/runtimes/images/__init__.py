"""Images where sessions run: a base root filesystem from the host (`hostfs`), per-instance images
of SWE-bench / SWE-Gym rows for docker and for bwrap (`build`), the rootfs image layout bwrap reads
(`layout`). docs/swegym.md."""
