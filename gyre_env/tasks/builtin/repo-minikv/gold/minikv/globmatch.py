"""Key patterns: *, ?, [set], [^set], ranges and backslash escapes."""


def _bracket(pattern, i, ch):
    """Match ch against the class starting after '[' at i; (matched, next index) or None."""
    j = i
    negate = j < len(pattern) and pattern[j] == "^"
    if negate:
        j += 1
    matched = False
    first = True
    while j < len(pattern) and (pattern[j] != "]" or first):
        first = False
        c = pattern[j]
        if c == "\\" and j + 1 < len(pattern):
            j += 1
            c = pattern[j]
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            hi = pattern[j + 2]
            if hi == "\\" and j + 3 < len(pattern):
                hi = pattern[j + 3]
                j += 1
            if c <= ch <= hi:
                matched = True
            j += 3
            continue
        if c == ch:
            matched = True
        j += 1
    if j >= len(pattern):
        return None  # unclosed: '[' is literal
    return matched != negate, j + 1


def glob_match(pattern, text):
    memo = {}

    def match(p, t):
        key = (p, t)
        if key in memo:
            return memo[key]
        if p == len(pattern):
            result = t == len(text)
        else:
            c = pattern[p]
            if c == "*":
                result = match(p + 1, t) or (t < len(text) and match(p, t + 1))
            elif t >= len(text):
                result = False
            elif c == "?":
                result = match(p + 1, t + 1)
            elif c == "[":
                found = _bracket(pattern, p + 1, text[t])
                if found is None:
                    result = text[t] == "[" and match(p + 1, t + 1)
                else:
                    ok, nxt = found
                    result = ok and match(nxt, t + 1)
            elif c == "\\" and p + 1 < len(pattern):
                result = text[t] == pattern[p + 1] and match(p + 2, t + 1)
            else:
                result = text[t] == c and match(p + 1, t + 1)
        memo[key] = result
        return result

    return match(0, 0)
