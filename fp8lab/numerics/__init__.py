"""The numerical spec in NumPy."""
