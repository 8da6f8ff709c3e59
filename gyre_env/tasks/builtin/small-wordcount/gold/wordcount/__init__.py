"""A wc clone with word frequencies."""
