#!/usr/bin/env python3
"""md2man.py -- turns a manual written in Markdown (docs/vpmm-dump.md and
the like) into a man page, so that each page has one source.

    md2man.py SOURCE.md OUT.N VERSION [--insert MARKER=FILE.md]...

Reads the subset of Markdown the manuals use:
  # name(N)                 the title: .TH, section N
  ## Heading                .SH (upper-cased); ### Heading: .SS
  paragraphs                .PP, filled
  ```fenced code```         shown as is, indented
  * item / - item           bullets (continuation lines indented)
  `term` then ": text"      a definition list entry (.TP)
  | a | b | tables          tbl(1) tables (the page asks man for tbl)
  `code` **bold** *italic* [text](target) <url>, \\* for a plain *
  <!-- MARKER -->           replaced by FILE.md given with --insert
Anything else is an error naming the line, rather than a page that renders
wrong. Only the standard library; writes ASCII roff (every other character
as a \\[uXXXX] escape), which groff renders without preconv.
"""
import re
import sys


class Md2ManError(Exception):
    pass


def escape_text(s):
    """Roff-escapes plain text (no Markdown left in it)."""
    s = s.replace("\\", "\\e")
    out = []
    for ch in s:
        if ord(ch) > 126:
            out.append("\\[u%04X]" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def escape_literal(s):
    """Text that is typed as it is (code, options): hyphens are minus signs,
    so that a reader can copy them."""
    return escape_text(s).replace("-", "\\-")


INLINE = re.compile(
    r"\\(?P<esc>[\\`*\[\]<>|_])"
    r"|`(?P<code>[^`]+)`"
    r"|\*\*(?P<bold>.+?)\*\*"
    r"|(?<![\w*])\*(?P<ital>[^*\s][^*]*?)\*(?![\w*])"
    r"|\[(?P<ltext>[^\]]+)\]\((?P<ltarget>[^)]+)\)"
    r"|<(?P<url>https?://[^>\s]+)>"
)


def inline(s):
    """Markdown inline markup to roff font changes."""
    out, pos = [], 0
    for m in INLINE.finditer(s):
        out.append(escape_text(s[pos:m.start()]))
        if m.group("esc") is not None:
            out.append(escape_text(m.group("esc")))
        elif m.group("code") is not None:
            out.append("\\fB" + escape_literal(m.group("code")) + "\\fR")
        elif m.group("bold") is not None:
            out.append("\\fB" + inline(m.group("bold")) + "\\fR")
        elif m.group("ital") is not None:
            out.append("\\fI" + inline(m.group("ital")) + "\\fR")
        elif m.group("ltext") is not None:
            text, target = m.group("ltext"), m.group("ltarget")
            out.append(inline(text))
            if re.match(r"https?://", target) and target != text:
                out.append(" (" + escape_literal(target) + ")")
        else:
            out.append(escape_literal(m.group("url")))
        pos = m.end()
    out.append(escape_text(s[pos:]))
    return "".join(out)


def roff_line(text):
    """A line of text as roff input: a leading dot or quote is not a
    request."""
    if text.startswith(".") or text.startswith("'"):
        return "\\&" + text
    return text


def plain(s):
    """Inline markup removed (the NAME line, which whatis reads)."""
    s = re.sub(r"`([^`]+)`", r"\1", s)
    s = re.sub(r"\*\*(.+?)\*\*", r"\1", s)
    return s


def table_cells(line, lineno):
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        raise Md2ManError("line %d: a table row must start and end with |" % lineno)
    # A | inside `code` does not split a cell.
    cells, cur, in_code = [], "", False
    for ch in line[1:-1]:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cells.append(cur.strip())
    return cells


def convert(lines, version, inserts):
    out = []
    uses_table = False
    section = ""
    i = 0
    n = len(lines)

    def para_lines(start):
        """The lines of a paragraph from `start`: up to a blank line or
        a line that starts another block."""
        j = start
        got = []
        while j < n and lines[j].strip() and not starts_block(j, first=j == start):
            got.append(lines[j].strip())
            j += 1
        return got, j

    def starts_block(j, first):
        s = lines[j]
        if s.startswith("#") or s.startswith("```") or s.startswith("|"):
            return True
        if re.match(r"[*-] ", s) or s.startswith("<!--"):
            return True
        if s.startswith(": "):
            return True
        # `term` followed by a definition
        if not first and j + 1 < n and lines[j + 1].startswith(": "):
            return True
        return False

    while i < n:
        line = lines[i]
        lineno = i + 1
        if not line.strip():
            i += 1
            continue
        m = re.match(r"# (\S+)\((\d)\)\s*$", line)
        if m:
            name, sect = m.group(1), m.group(2)
            out.append('.TH "%s" "%s" "" "libvpmm %s" "libvpmm manual"'
                       % (escape_text(name.upper()), sect, escape_text(version)))
            out.append(".nh")  # no hyphenation: names and paths stay whole
            i += 1
            continue
        if line.startswith("# "):
            raise Md2ManError("line %d: the title must be '# name(section)'" % lineno)
        m = re.match(r"(#{2,3}) (.+)$", line)
        if m:
            title = m.group(2).strip()
            if len(m.group(1)) == 2:
                section = title.upper()
                out.append('.SH "%s"' % escape_text(plain(section)))
            else:
                out.append('.SS "%s"' % inline(title).replace('"', "\\(dq"))
            i += 1
            continue
        if line.startswith("<!--"):
            m = re.match(r"<!--\s*(\S+)\s*-->\s*$", line)
            if not m:
                raise Md2ManError("line %d: a comment must be one line, <!-- MARKER -->" % lineno)
            marker = m.group(1)
            if marker in inserts:
                sub = convert(inserts[marker], version, {})
                uses_table = uses_table or sub[0]
                out.extend(sub[1])
            i += 1
            continue
        if line.startswith("```"):
            j = i + 1
            code = []
            while j < n and not lines[j].startswith("```"):
                code.append(lines[j])
                j += 1
            if j == n:
                raise Md2ManError("line %d: code block without its closing ```" % lineno)
            out += [".PP", ".RS 4", ".nf"]
            out += [roff_line(escape_text(c)) if c else "" for c in code]
            out += [".fi", ".RE"]
            i = j + 1
            continue
        if line.startswith("|"):
            header = table_cells(line, lineno)
            if i + 1 >= n or not re.match(r"\|[\s:|-]+\|\s*$", lines[i + 1]):
                raise Md2ManError("line %d: a table needs a |---|---| line under its header" % lineno)
            rows = []
            j = i + 2
            while j < n and lines[j].startswith("|"):
                row = table_cells(lines[j], j + 1)
                if len(row) != len(header):
                    raise Md2ManError("line %d: %d cells, the header has %d"
                                      % (j + 1, len(row), len(header)))
                rows.append(row)
                j += 1
            uses_table = True
            cols = len(header)
            # .ne for the table's height (about two lines a row): groff's
            # man macros then lengthen the page (continuous rendering, as
            # man and check_install.sh's groff use) or break it (paged)
            # before the table, so no row's text block is cut by a page
            # end, which tbl warns of.
            out += [".PP", ".ne %dv" % (3 + 2 * len(rows)), ".TS", "tab(\t);",
                    " ".join(["lb"] * cols),
                    " ".join(["l"] * (cols - 1) + ["lx"]) + "."]
            out.append("\t".join(inline(c) for c in header))
            out.append("_")
            for row in rows:
                out.append("\t".join("T{\n" + roff_line(inline(c)) + "\nT}" for c in row))
            out.append(".TE")
            i = j
            continue
        m = re.match(r"[*-] (.*)$", line)
        if m:
            text = [m.group(1).strip()]
            j = i + 1
            while j < n and lines[j].startswith("  ") and lines[j].strip():
                text.append(lines[j].strip())
                j += 1
            out.append(".IP \\(bu 2")
            out += [roff_line(inline(t)) for t in text]
            i = j
            continue
        if i + 1 < n and lines[i + 1].startswith(": "):
            # definition list entry: term, then ": text" and indented lines
            out.append(".TP")
            out.append(roff_line(inline(line.strip())))
            text = [lines[i + 1][2:].strip()]
            j = i + 2
            while j < n and lines[j].startswith("  ") and lines[j].strip():
                text.append(lines[j].strip())
                j += 1
            out += [roff_line(inline(t)) for t in text]
            i = j
            continue
        if line.startswith(": "):
            raise Md2ManError("line %d: ': definition' without its term on the line before" % lineno)
        text, j = para_lines(i)
        if section == "NAME":
            joined = plain(" ".join(text)).replace("\u2014", "-").replace(" - ", " \\- ", 1)
            out.append(roff_line(escape_text(joined).replace("\\e-", "\\-")))
        else:
            out.append(".PP")
            out += [roff_line(inline(t)) for t in text]
        i = j
    return uses_table, out


def main(argv):
    args = argv[1:]
    inserts = {}
    pos = []
    k = 0
    while k < len(args):
        if args[k] == "--insert" and k + 1 < len(args):
            marker, _, path = args[k + 1].partition("=")
            if not path:
                raise Md2ManError("--insert takes MARKER=FILE")
            with open(path, encoding="utf-8") as f:
                inserts[marker] = f.read().splitlines()
            k += 2
        else:
            pos.append(args[k])
            k += 1
    if len(pos) != 3:
        raise Md2ManError("usage: md2man.py SOURCE.md OUT VERSION [--insert MARKER=FILE]...")
    src, dst, version = pos
    with open(src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        uses_table, body = convert(lines, version, inserts)
    except Md2ManError as e:
        raise Md2ManError("%s: %s" % (src, e))
    if not body or not body[0].startswith(".TH"):
        raise Md2ManError("%s: the first line must be the title, '# name(section)'" % src)
    head = ["'\\\" t"] if uses_table else []
    head.append('.\\" Generated from %s by man/md2man.py: edit that file.'
                % escape_text(src.split("/")[-2] + "/" + src.split("/")[-1] if "/" in src else src))
    with open(dst, "w", encoding="ascii") as f:
        f.write("\n".join(head + body) + "\n")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (Md2ManError, OSError) as e:
        sys.stderr.write("md2man.py: %s\n" % e)
        sys.exit(1)
