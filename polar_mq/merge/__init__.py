"""Trajectory builders: turn a session's `CaptureRecord`s into `Trace`s inside a `Trajectory`.

Pure logic (no Flask, Celery or Redis) so that the gateway, the postrun worker, tests and offline
tools all build trajectories the same way. Use :func:`build`; builders are chosen by name
(``per_request``, ``prefix_merging``) or by ``module:Class`` for custom ones.
"""

from polar_mq.merge.base import Builder, BuildResult
from polar_mq.merge.per_request import PerRequestBuilder, PerRequestConfig
from polar_mq.merge.prefix_merging import PrefixMergingBuilder, PrefixMergingConfig
from polar_mq.merge.registry import available_builders, build, get_builder, register

__all__ = [
    "Builder",
    "BuildResult",
    "PerRequestBuilder",
    "PerRequestConfig",
    "PrefixMergingBuilder",
    "PrefixMergingConfig",
    "available_builders",
    "build",
    "get_builder",
    "register",
]
