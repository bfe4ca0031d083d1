"""Adapters: KernelZero's sandboxed verdict as the reward of other RL stacks, each on the library's own extension
point with the library an optional dependency (``pip install 'kernelzero[envs-<name>]'``; docs/environments.md).

- :mod:`kernelzero.envs.trl`: ``GRPOTrainer(reward_funcs=...)`` async reward functions
- :mod:`kernelzero.envs.verl`: ``compute_score`` (async) and ``compute_score_batch``
- :mod:`kernelzero.envs.verifiers_taskset`: the ``kernelzero`` taskset and multi-turn env of ``verifiers.v1``
- :mod:`kernelzero.envs.openenv`: an OpenEnv environment server (reset/step) and its client
- :mod:`kernelzero.envs.tasks`: proposer output and KernelBench folders as a Hugging Face dataset
"""
