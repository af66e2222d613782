#!/usr/bin/python3
"""Extract the ```sql blocks of markdown files for test/docs/run.sh.

    extract.py OUTDIR FILE...

Writes OUTDIR/NNNN.sql (the block, dedented) and prints one line per block,
tab-separated: NNNN, file, line of the opening fence, mode (run or skip),
role (for mode run: the role to run it as, or -) and the reason (skip).

A block is marked by an HTML comment on the line just before its fence:
    <!-- docs-test: skip (why) -->      not run; counted as skipped
    <!-- docs-test: as ROLE -->         run after SET ROLE ROLE
An unknown docs-test comment, or an unclosed fence, is an error (exit 2).
"""
import os
import re
import sys

DIRECTIVE = re.compile(r'^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$')
FENCE = re.compile(r'^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)\s*$')


def blocks(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        start = i
        body = []
        i += 1
        while i < len(lines):
            close = re.match(r'^\s*' + re.escape(fence[0]) + '{%d,}\\s*$' % len(fence), lines[i])
            if close:
                break
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        else:
            sys.exit(f'{path}:{start + 1}: unclosed code fence')
        i += 1
        if lang != 'sql':
            continue
        mode, role, reason = 'run', '-', ''
        if start > 0:
            d = DIRECTIVE.match(lines[start - 1])
            if d:
                words = d.group(1)
                if words.startswith('skip'):
                    mode, reason = 'skip', words[4:].strip().strip('()') or 'no reason given'
                elif re.fullmatch(r'as [A-Za-z_][A-Za-z0-9_]*', words):
                    role = words.split()[1]
                else:
                    print(f'{path}:{start}: unknown docs-test comment: {words}', file=sys.stderr)
                    sys.exit(2)
        yield start + 1, mode, role, reason, '\n'.join(body) + '\n'


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    n = 0
    for path in sys.argv[2:]:
        for line, mode, role, reason, text in blocks(path):
            n += 1
            name = f'{n:04d}'
            with open(os.path.join(outdir, name + '.sql'), 'w', encoding='utf-8') as f:
                f.write(text)
            print('\t'.join([name, path, str(line), mode, role, reason]))


if __name__ == '__main__':
    main()
