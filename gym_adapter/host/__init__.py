"""The Gym host: the episode API, the host's parts, user calls, loading."""
