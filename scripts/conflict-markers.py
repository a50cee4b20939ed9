#!/usr/bin/env python3
"""conflict-markers.py ROOT — fails if a file of the repository still holds a
merge's conflict markers (a line that starts with seven '<' or '>' and a
space, or is seven '=' alone). Lists each such line as FILE:LINE. Build
directories and .git are skipped; files that are not UTF-8 text are
skipped."""
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
bad = []
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x != ".git" and not x.startswith("build")]
    for f in files:
        path = os.path.join(d, f)
        try:
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line.rstrip("\n") == "=======":
                        bad.append("%s:%d" % (os.path.relpath(path, root), n))
        except (UnicodeDecodeError, OSError):
            continue
for b in bad:
    print("conflict marker: " + b)
sys.exit(1 if bad else 0)
