"""The environments."""
