"""The verification engine, the trust anchor: kept in core so that no entry point can swap it.

* :mod:`.judge` decides verdicts (:class:`~core.verification.judge.Verifier`);
* :mod:`.sandbox` starts and talks to worker processes; :mod:`.worker` is what runs inside them;
* :mod:`.evidence` holds the numerics: inputs' digests, output comparisons, tolerances;
* :mod:`.devicelock` and :mod:`.devicemem` share a GPU between workers and keep outputs on it;
* :mod:`.baselines` caches a task's reference timings; :mod:`.executor` spreads verdicts over shards.
"""
