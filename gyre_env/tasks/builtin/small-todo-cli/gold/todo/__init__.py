"""A todo manager."""

from todo.store import NotFoundError, TodoError, TodoStore

__all__ = ["NotFoundError", "TodoError", "TodoStore"]
