"""Greedy word wrapping."""


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most `width` characters, words kept whole; a word longer than `width` gets a
    line of its own, split into `width`-sized pieces. Whitespace runs count as one space."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > width:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not word:
            continue
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
