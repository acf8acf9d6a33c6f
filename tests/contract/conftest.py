"""Contract tier (the ``contract`` marker comes from tests/conftest.py; fixtures from tests/support/clusterfix.py)."""
