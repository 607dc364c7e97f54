"""polar_mq: rollouts for RL of LLM agents through unmodified agent harnesses.

A gateway proxy records every model call a harness makes (exact token ids and logprobs), a
message-queue pipeline runs sessions at scale, and builders turn the recordings into trajectories.
"""

__version__ = "0.1.0"
