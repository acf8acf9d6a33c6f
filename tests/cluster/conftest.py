"""Cluster tier (the ``cluster`` marker comes from tests/conftest.py; fixtures from tests/support/clusterfix.py)."""
