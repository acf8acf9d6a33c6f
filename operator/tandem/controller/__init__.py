"""The operator process: kopf wiring around the level-based reconcile loops (`tandem run`).

Modules, top to bottom (no cycle, no module-level runtime state):

- ``main``: `tandem run` — flags, logging, leader election, health, ``kopf.run``; imports ``pools`` and
  ``caches`` so their handlers register with kopf.
- ``pools`` / ``caches``: the InferencePool and MooncakeCache handlers and daemons. They reach this
  process's state only through kopf's ``memo`` (``memo.runtime``), set up by the startup handler.
- ``runtime``: the per-process state (``Runtime``, ``Wakeups``) and the Prometheus providers.
- ``config``: ``OperatorConfig``, the one source of every default and of the environment variables.
- ``metrics``: the operator's own Prometheus metrics.
- ``election``: the Lease elector thread and the /healthz, /readyz server.
"""
