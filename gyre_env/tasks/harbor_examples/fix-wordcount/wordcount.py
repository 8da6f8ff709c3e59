import sys


def counts(text):
    lines = text.split("\n")
    words = sum(len(line.split(" ")) for line in lines)
    return len(lines), words, len(text)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print(*counts(f.read()))
