"""A thread pool and a parallel command runner."""
