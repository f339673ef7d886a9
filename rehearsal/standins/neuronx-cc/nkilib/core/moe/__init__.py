"""Stand-in package (see nkilib/__init__.py)."""
