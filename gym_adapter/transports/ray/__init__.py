"""The Ray transport."""
