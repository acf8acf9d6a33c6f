"""tandem_lab.dev: the local control plane, engine doubles, metric exporter, demo and benchmarks' kit."""
