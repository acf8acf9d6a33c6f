"""tandem.reconcile."""
