"""A third-party KernelZero plugin: the ``brevity`` reward term and its ``reward=brevity`` config.

Install it (``pip install ./examples/kernelzero-brevity``) and run
``python -m core.run reward=brevity``: nothing in KernelZero's core or conf/ changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import hookimpl


@dataclass
class BrevityTerm:
    """1 for an empty kernel module, falling linearly to 0 at ``max_chars`` characters.

    Only accepted candidates earn it (the reward mix gives failures ``failure_reward``).
    """

    name: str = "brevity"
    max_chars: int = 8000

    def __call__(self, verdicts, tasks, candidates=None, **context):
        if candidates is None:
            raise ValueError("the brevity term needs the candidates; call it through core.loop.rewards.RewardMix")
        return [max(0.0, 1.0 - len(c.source) / self.max_chars) for c in candidates]


@hookimpl
def register_rewards(register):
    register("brevity", BrevityTerm)


@hookimpl
def register_configs(config_store):
    # The `reward=brevity` option: correctness first, a small bonus for shorter kernels.
    config_store.store(
        group="reward",
        name="brevity",
        node={
            "weights": {"correctness": 1.0, "brevity": 0.25},
            "failure_reward": 0.0,
            "term_kwargs": {"brevity": {"max_chars": 8000}},
        },
    )
