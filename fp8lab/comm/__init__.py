"""Communication."""
