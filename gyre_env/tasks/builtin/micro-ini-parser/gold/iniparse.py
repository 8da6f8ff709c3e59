"""An INI parser and writer."""


class IniError(ValueError):
    def __init__(self, message, lineno):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def parse_ini(text):
    result = {}
    section = None
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip()
            if not name:
                raise IniError("empty section name", lineno)
            section = result.setdefault(name, {})
            continue
        if "=" not in line:
            raise IniError(f"cannot parse {line!r}", lineno)
        key, _, value = line.partition("=")
        key = key.strip().lower()
        value = value.strip()
        if not key:
            raise IniError("empty key", lineno)
        if section is None:
            raise IniError("key outside of any section", lineno)
        if key in section:
            raise IniError(f"duplicate key {key!r}", lineno)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        section[key] = value
    return result


def dump_ini(data):
    blocks = []
    for name, values in data.items():
        lines = [f"[{name}]"]
        for key, value in values.items():
            if value == "" or value != value.strip():
                value = f'"{value}"'
            lines.append(f"{key} = {value}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
