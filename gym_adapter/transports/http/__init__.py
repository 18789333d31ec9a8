"""The HTTP transport."""
