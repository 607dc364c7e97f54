"""One CSV row: fields split on a delimiter, double-quoted fields may hold it, `""` is a quote."""


def split_row(line: str, delim: str = ",") -> list[str]:
    fields: list[str] = []
    field: list[str] = []
    i, quoted = 0, False
    line = line.rstrip("\r\n")
    while i < len(line):
        c = line[i]
        if quoted:
            if c == '"':
                if i + 1 < len(line) and line[i + 1] == '"':
                    field.append('"')
                    i += 1
                else:
                    quoted = False
            else:
                field.append(c)
        elif c == '"' and not field:
            quoted = True
        elif c == delim:
            fields.append("".join(field))
            field = []
        else:
            field.append(c)
        i += 1
    if quoted:
        raise ValueError("unterminated quoted field")
    fields.append("".join(field))
    return fields


def join_row(fields: list[str], delim: str = ",") -> str:
    """The row `split_row` reads back as `fields`."""
    out = []
    for f in fields:
        if delim in f or '"' in f or "\n" in f or f != f.strip():
            f = '"' + f.replace('"', '""') + '"'
        out.append(f)
    return delim.join(out)
