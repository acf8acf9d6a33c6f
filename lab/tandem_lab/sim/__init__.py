"""tandem_lab.sim: the offline fleet simulator (docs/design/007-simulator.md, benchmarks.md).

A library with a thin CLI (``tandem sim run``): :func:`tandem_lab.sim.runner.run` builds a scenario's
workload and bounds and simulates policies on it; :func:`tandem_lab.sim.report.write` writes
``results.json``, ``summary.md`` and plots. Tandem's own routing and autoscaling are imported from
``tandem.routing`` and ``tandem.core``; nothing here imports Kubernetes or Prometheus clients.
"""
