#!/usr/bin/env python3
"""Splits, in the work tree, the lines that swift format cannot shorten: a one-off helper for the
tree-wide formatting commit, not part of the build or of CI.

    python3 Scripts/split-long-lines.py [PATH_PREFIX ...]    # then ./Scripts/format.sh

It formats a copy of the tree (./Scripts/format.sh in a temporary folder), reads what
./Scripts/format.sh --check still reports there, and rewrites the source of each finding whose path
starts with one of the prefixes (all paths when none is given):
  - a long one-line string literal becomes a multi-line literal whose lines end in `\` (the value is
    the same, byte for byte, and it stays a literal, so a Comment, a Logger.Message or a @Test name
    still takes it); in a `+` chain it becomes more `+` parts instead;
  - a long line inside a multi-line literal: its paragraph (the lines joined by `\`) is rewrapped
    with `\` at the ends, again leaving the value as it was;
  - a long `//` or `///` comment is wrapped; an end-of-line comment that overflows moves above its line.
It never splits inside an interpolation or in the middle of a word; what it cannot do (Markdown
tables and code in doc comments, regex literals, long code) it lists for a hand. It runs a few
rounds, since a split line may still be long once formatted. Review the diff before committing.
"""
import collections, os, re, shutil, subprocess, sys, tempfile

MAX = 120
def parse_literal(s, i):
    """s[i:] starts a single-line literal (#*"). Returns (end, hashes, atoms) or None."""
    h = 0
    while i + h < len(s) and s[i + h] == '#': h += 1
    if i + h >= len(s) or s[i + h] != '"' or s[i + h:i + h + 3] == '"""': return None
    j = i + h + 1; atoms = []; hs = '#' * h
    while j < len(s):
        c = s[j]
        if c == '\\' and s[j + 1:j + 1 + h] == hs:
            k = j + 1 + h
            if k < len(s) and s[k] == '(':
                depth = 1; k += 1
                while k < len(s) and depth:
                    if s[k] in '#"':
                        r = parse_literal(s, k)
                        if r: k = r[0]; continue
                    if s[k] == '(': depth += 1
                    elif s[k] == ')': depth -= 1
                    k += 1
                atoms.append(s[j:k]); j = k
            elif k < len(s) and s[k] == 'u' and s[k+1:k+2] == '{':
                e = s.index('}', k); atoms.append(s[j:e + 1]); j = e + 1
            else:
                atoms.append(s[j:k + 1]); j = k + 1
        elif c == '"' and s[j + 1:j + 1 + h] == hs:
            return (j + 1 + h, h, atoms)
        else:
            atoms.append(c); j += 1
    return None

def literals(line):
    """Top-level single-line literals of a line: (start, end, hashes, atoms); stops at a // comment."""
    out = []; i = 0
    while i < len(line):
        if line.startswith('//', i): break
        if line.startswith('"""', i) or line.startswith('#"""', i): return out  # multi-line: leave
        if line[i] in '#"':
            r = parse_literal(line, i)
            if r:
                out.append((i, r[0], r[1], r[2])); i = r[0]; continue
        i += 1
    return out

def comment_start(line):
    i = 0
    while i < len(line):
        if line.startswith('//', i): return i
        if line[i] in '#"':
            r = parse_literal(line, i)
            if r: i = r[0]; continue
        i += 1
    return None

def breakable(cur, k):
    """May a part end after cur[k]?"""
    a = cur[k]; nxt = cur[k + 1] if k + 1 < len(cur) else ''
    return a == ' ' or (a in ',;' and nxt != ' ') or (nxt.startswith('\\') and '(' in nxt[:3] and a != ' ' and False)

def split_atoms(atoms, width):
    parts = []; cur = []; curlen = 0
    for a in atoms:
        if cur and curlen + len(a) > width:
            cut = None
            for k in range(len(cur) - 1, -1, -1):
                if breakable(cur, k) and sum(len(x) for x in cur[:k + 1]) > width // 3:
                    cut = k + 1; break
            if cut is None:
                return None
            parts.append(cur[:cut]); cur = cur[cut:]; curlen = sum(len(x) for x in cur)
        cur.append(a); curlen += len(a)
    if cur: parts.append(cur)
    return [''.join(p) for p in parts]

def content_atoms(text, h):
    """Atoms of a multi-line literal's content line: an interpolation is one atom."""
    out = []; j = 0; hs = '#' * h
    while j < len(text):
        if text[j] == '\\' and text[j + 1:j + 1 + h] == hs:
            k = j + 1 + h
            if k < len(text) and text[k] == '(':
                depth = 1; k += 1
                while k < len(text) and depth:
                    if text[k] in '#"':
                        r = parse_literal(text, k)
                        if r: k = r[0]; continue
                    if text[k] == '(': depth += 1
                    elif text[k] == ')': depth -= 1
                    k += 1
                out.append(text[j:k]); j = k
            else:
                out.append(text[j:k + 1]); j = k + 1
        else:
            out.append(text[j]); j += 1
    return out

def indent_of(line): return len(line) - len(line.lstrip(' '))

def fix_round(SRC, trial, checkfile, prefixes):
    # long lines of the trial, outside Sync/
    longs = collections.defaultdict(list)
    eol = collections.defaultdict(list)
    for l in open(checkfile):
        m = re.match(r'(\S+?):(\d+):(?:\d+:)? error: (.*)', l)
        if not m: continue
        path, n, msg = m.group(1), int(m.group(2)), m.group(3)
        if path.startswith('./'): path = path[2:]
        if prefixes and not any(path.startswith(p) for p in prefixes): continue
        if 'over 120' in msg: longs[path].append(n)
        elif 'EndOfLineComment' in msg: eol[path].append(n)

    manual = []; edited = 0
    for path in sorted(set(longs) | set(eol)):
        tl = open(os.path.join(trial, path)).read().split('\n')
        inside = {}; state = None
        for k, t in enumerate(tl, 1):
            if state is not None:
                inside[k] = state
                if '"""' in t: state = None
                continue
            m3 = re.search(r'(#*)"""\s*$', t)
            if m3 and t.count('"""') == 1: state = m3.group(1)
        src = open(os.path.join(SRC, path)).read(); original = src
        edits = []  # (old, new) textual replacements on the source
        for n in sorted(set(longs[path]) | set(eol[path])):
            line = tl[n - 1]; ind = indent_of(line)
            cs = comment_start(line)
            stripped = line.strip()
            if n in inside:
                h = inside[n]
                occ = [m.start() for m in re.finditer(re.escape(stripped), src)]
                if len(occ) != 1: manual.append(f'{path}:{n}: content found {len(occ)}x'); continue
                ls = src.rfind('\n', 0, occ[0]) + 1; le = src.find('\n', occ[0])
                sline = src[ls:le]
                # the literal's base indentation: its closing delimiter's
                close = src.find('"""', le); cl = src.rfind('\n', 0, close) + 1
                base = src[cl:close]
                if base.strip() != '': manual.append(f'{path}:{n}: closing not alone'); continue
                shift = ind - indent_of(sline)  # the formatter moves the line by this much
                cont = '\\' + h
                slines = src.split('\n'); si = src.count('\n', 0, ls)
                a = si
                while a - 1 >= 0 and slines[a - 1].endswith(cont) and slines[a - 1].startswith(base) and '"""' not in slines[a - 1]: a -= 1
                b = si
                while slines[b].endswith(cont) and '"""' not in slines[b + 1]: b += 1
                run = slines[a:b + 1]
                if any(not x.startswith(base) for x in run): manual.append(f'{path}:{n}: content indentation'); continue
                texts = [x[len(base):] for x in run]
                texts = [t[:-len(cont)] if t.endswith(cont) and k < len(texts) - 1 else t for k, t in enumerate(texts)]
                if texts[-1].endswith(cont): manual.append(f'{path}:{n}: run ends continued'); continue
                logical = ''.join(texts)
                lead = len(logical) - len(logical.lstrip(' '))
                atoms = [logical[:lead]] + content_atoms(logical[lead:], len(h)) if lead else content_atoms(logical, len(h))
                width = MAX - shift - len(base) - 1 - len(h)
                parts = split_atoms(atoms, width)
                if not parts: manual.append(f'{path}:{n}: content: no cut'); continue
                assert ''.join(parts) == logical
                if any(p.endswith(' ') is False for p in parts[:-1]) and False: pass
                newrun = [base + p + cont for p in parts[:-1]] + [base + parts[-1]]
                edits.append(('\n'.join(run), '\n'.join(newrun))); continue
            if stripped.startswith('//'):
                # a comment line: wrap it at a space
                prefix_m = re.match(r'(\s*///?\s?)', line); prefix = prefix_m.group(1)
                body = line[len(prefix):]
                if '|' in body[:2] or body.startswith('    ') or '```' in body or len(prefix.strip()) > 3:
                    manual.append(f'{path}:{n}: comment (table/code)'); continue
                cont = prefix + ('  ' if body.startswith('- ') else '')
                # find in source: the same comment text
                key = prefix.strip() + ' ' + body
                occ = [m.start() for m in re.finditer(re.escape(body), src)]
                if len(occ) != 1: manual.append(f'{path}:{n}: comment found {len(occ)}x'); continue
                # source line
                ls = src.rfind('\n', 0, occ[0]) + 1; le = src.find('\n', occ[0])
                sline = src[ls:le]; sprefix = sline[:sline.index(body)]
                if sprefix.strip() not in ('//', '///'):
                    manual.append(f'{path}:{n}: comment prefix {sprefix!r}'); continue
                sind = sprefix[:len(sprefix) - len(sprefix.lstrip())]
                cont = sprefix + ('  ' if body.startswith('- ') else '')
                words = body.split(' '); out = []; cur = sprefix
                for w in words:
                    if cur.strip() not in ('//', '///', '') and len(cur) + 1 + len(w) > MAX - 0 and cur != sprefix and cur != cont:
                        out.append(cur.rstrip()); cur = cont + w
                    else:
                        cur = cur + ('' if cur in (sprefix, cont) else ' ') + w
                out.append(cur.rstrip())
                if len(out) > 1 and len(out[-1][len(cont):].split()) < 3:
                    words2 = (out[-2][len(sprefix if len(out) == 2 else cont):] + ' ' + out[-1][len(cont):]).split(' ')
                    head = sprefix if len(out) == 2 else cont
                    for k in range(len(words2) - 3, 0, -1):
                        a2 = head + ' '.join(words2[:k]); b2 = cont + ' '.join(words2[k:])
                        if len(a2) <= MAX and len(b2) <= MAX: out[-2:] = [a2, b2]; break
                if any(len(x) > MAX for x in out): manual.append(f'{path}:{n}: comment word too long'); continue
                edits.append((sline, '\n'.join(out)))
                continue
            if cs is not None and n in eol[path] or (cs is not None and len(line[:cs].rstrip()) <= MAX):
                # an end-of-line comment: move it above its source line
                comment = line[cs:]
                occ = [m.start() for m in re.finditer(re.escape(comment), src)]
                if len(occ) != 1: manual.append(f'{path}:{n}: eol comment found {len(occ)}x'); continue
                ls = src.rfind('\n', 0, occ[0]) + 1; le = src.find('\n', occ[0])
                sline = src[ls:le]; code = sline[:sline.index(comment)].rstrip()
                sind = ' ' * indent_of(sline)
                if code.strip() in (')', ']', '}', '})', ')]', '),', '],'):
                    manual.append(f'{path}:{n}: eol comment after a closer'); continue
                new = sind + comment + '\n' + code
                if len(sind + comment) > MAX: manual.append(f'{path}:{n}: eol comment too long'); continue
                edits.append((sline, new)); continue
            lits = [x for x in literals(line) if x[1] - x[0] > 30]
            if not lits:
                manual.append(f'{path}:{n}: no literal: {stripped[:80]}'); continue
            # the longest literal
            st, en, h, atoms = max(lits, key=lambda x: x[1] - x[0])
            text = line[st:en]
            cnt = src.count(text)
            if cnt == 0: manual.append(f'{path}:{n}: literal not in source'); continue
            q = '#' * h
            # source line indentation of the first occurrence
            pos = src.index(text); ls = src.rfind('\n', 0, pos) + 1
            sind = indent_of(src[ls:src.find('\n', pos)])
            bind = ' ' * (max(sind, ind) + 4)
            width = MAX - len(bind) - 2 - h
            parts = split_atoms(atoms, width)
            if not parts or len(parts) < 2: manual.append(f'{path}:{n}: could not split'); continue
            after = src[pos + len(text):].lstrip()
            before = src[:pos].rstrip()
            if parts[-1].endswith(' ') or after.startswith('+') or before.endswith('+'):
                # In a + chain: the tail joins the next literal of the chain when there is one (it is
                # split in turn on the next round), so the chain is rewrapped rather than chopped.
                following = re.match(r'(\s*\+\s*)', src[pos + len(text):])
                nxt = None
                if following and src.count(text) == 1:
                    at = pos + len(text) + following.end()
                    if src[at:at + 1] == '"' and src[at:at + 3] != '"""':
                        r = parse_literal(src, at)
                        if r and r[1] == 0 and not h: nxt = (at, r[0])
                if nxt and len(parts) > 1:
                    head_parts = split_atoms(atoms, width)
                    merged = ''.join(parts[1:])
                    old_span = src[pos:nxt[1]]
                    new_span = f'"{parts[0]}"' + following.group(1) + '"' + merged + src[nxt[0] + 1:nxt[1]]
                    edits.append((old_span, new_span)); continue
                new = (' + ').join(f'{q}"{p}"{q}' for p in parts)
                assert ''.join(parts) == ''.join(atoms)
                edits.append((text, new)); continue
            cont = '\\' + q
            body = ''.join(f'{bind}{p}{cont}\n' for p in parts[:-1]) + f'{bind}{parts[-1]}\n'
            new = f'{q}"""\n{body}{bind}"""{q}'
            # check: content joined equals the original body
            assert ''.join(parts) == ''.join(atoms)
            edits.append((text, new))
        for old, new in edits:
            if old not in src: manual.append(f'{path}: edit lost: {old[:60]}'); continue
            src = src.replace(old, new)
        if src != original:
            open(os.path.join(SRC, path), 'w').write(src); edited += 1
    return edited, manual


def main():
    root = subprocess.run(['git', 'rev-parse', '--show-toplevel'], capture_output=True, text=True,
                          check=True).stdout.strip()
    prefixes = sys.argv[1:]
    manual = []
    for round in range(1, 9):
        with tempfile.TemporaryDirectory() as trial:
            listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'], cwd=root,
                                    capture_output=True, text=True, check=True).stdout.split('\n')
            for path in listed:
                if path and os.path.isfile(os.path.join(root, path)):
                    os.makedirs(os.path.dirname(os.path.join(trial, path)) or trial, exist_ok=True)
                    shutil.copy2(os.path.join(root, path), os.path.join(trial, path))
            subprocess.run(['git', 'init', '-q'], cwd=trial, check=True)
            subprocess.run(['git', 'add', '-A'], cwd=trial, check=True)
            subprocess.run(['./Scripts/format.sh'], cwd=trial, check=True)
            check = subprocess.run(['./Scripts/format.sh', '--check'], cwd=trial, capture_output=True, text=True)
            checkfile = os.path.join(trial, '.check.txt')
            open(checkfile, 'w').write(check.stdout + check.stderr)
            edited, manual = fix_round(root, trial, checkfile, prefixes)
        print(f'round {round}: {edited} file(s) edited, {len(manual)} finding(s) left for a hand', file=sys.stderr)
        if not edited:
            break
    print('\n'.join(sorted(set(manual))))


if __name__ == '__main__':
    main()
