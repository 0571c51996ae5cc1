"""Measurement jobs: a SQLite store, a one-at-a-time queue, and the child process that runs one.

Kept free of imports: the spawned child imports ``app.jobs.child`` and nothing more.
"""
