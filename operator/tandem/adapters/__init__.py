"""tandem.adapters."""
