"""tandem.builders."""
