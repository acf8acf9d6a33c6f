"""tandem.dev."""
