"""tandem.sim."""
