"""The transports: embedded, and what every remote transport shares."""
