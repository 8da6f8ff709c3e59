"""A small language for exact arithmetic."""
