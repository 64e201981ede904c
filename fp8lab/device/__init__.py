"""The device."""
