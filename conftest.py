"""Root conftest: loads the shared cluster fixtures plugin for every tier that needs a real cluster."""

pytest_plugins = ["tests.support.clusterfix"]
