"""tandem.api."""
