"""Hand-offs from polar_mq groups to trainers.

* ``samples``: a finished group (``GET /v1/groups/next``) -> typed ``TrainSample`` rows with
  group-relative advantages; the one conversion every trainer below starts from.
* ``trl``: a rollout function for TRL's ``GRPOTrainer`` that samples through polar_mq sessions.
* ``slime``: a group -> slime ``Sample`` objects (or their field dicts).
* ``verl``: a group -> the tensors and non-tensor fields of a verl ``DataProto``.

Nothing here imports torch, TRL, slime or verl at module import time: each mapping needs only its
own trainer's package, and only when it builds that trainer's objects.
"""

from polar_mq.rl.trainers.samples import GroupBatch
from polar_mq.rl.trainers.samples import TrainSample
from polar_mq.rl.trainers.samples import samples_from_group

__all__ = ["GroupBatch", "TrainSample", "samples_from_group"]
