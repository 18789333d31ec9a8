"""The simulation."""
