"""Scale tier (the ``scale`` marker comes from tests/conftest.py; fixtures from tests/support/clusterfix.py)."""
