"""The Tandem lab: everything around the operator that never ships in its image.

The fleet simulator (``sim``), the local control plane and fake engines (``dev``), the demo and the
benchmarks. It imports the product (``tandem``) only through its pure public surfaces and the local
cluster kit; the product never imports the lab (import-linter enforces both). Its commands reach the
``tandem`` CLI through the ``tandem.commands`` entry points declared in ``lab/pyproject.toml``.
"""
