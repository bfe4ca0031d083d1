"""Built-in verification executors (``executor=local``, ``executor=ray``), registered through
``register_executors`` exactly as a third-party executor is. Their shared base, the shards and the
scheduler live in :mod:`core.verification.executor`."""
