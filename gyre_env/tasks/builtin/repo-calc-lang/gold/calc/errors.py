"""Errors with source positions."""


class CalcError(Exception):
    def __init__(self, message, line, col):
        super().__init__(f"{line}:{col}: {message}")
        self.message = message
        self.line = line
        self.col = col


class CalcSyntaxError(CalcError):
    pass


class CalcRuntimeError(CalcError):
    pass
