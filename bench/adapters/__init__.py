"""One adapter per measured system, each run inside that system's own virtual environment."""
