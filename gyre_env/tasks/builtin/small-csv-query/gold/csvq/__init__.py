"""Query CSV files."""
