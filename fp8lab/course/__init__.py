"""The course."""
