#!/usr/bin/python3
"""The documentation as a reader meets it: README.md and doc/*.md.

Usage: docs_test.py TOP BUILD CASE, CASE one of
  links      (unit) every relative link and #anchor resolves, README stays a
             front page (at most 400 lines), and every fenced block says what
             it is (see "Fences" below)
  citations  (unit) a comment, message or test that cites a section by name
             (README "X", doc/server.md "X") names a heading that exists there
  tables     (unit) the marked result tables of README.md and doc/*.md
             (doc/performance.md, doc/embeddings.md) are what
             bench/tables.py makes from bench/results
  recipes    (integration) every runnable block runs, as pasted, on this machine

Fences. A block's info string says what it is: `sh` and `python` are
recipes, run by the recipes case; `sh skip=REASON` and `python skip=REASON`
are recipes this machine cannot or should not run (another host, RDMA, a
benchmark of minutes, a fragment of a program), REASON said to the reader;
`text` is output or a listing. A fence with no info string fails `links`.

How the recipes run. The runnable blocks of one file run in order in one
bash (`set -euo pipefail`; a python block through `python3 -`), so a later
block sees an earlier one's variables and servers, from the checkout's top
folder, with README's one setting (PYTHONPATH=learner/python), Debian's
python3 first on PATH (README: the snippets run with Debian's python3), and these
substitutions, each what README tells a reader or a private place for a
shared machine:
  - `sudo ` is dropped (README: as root, type commands without it);
  - `/tmp/`, `/mnt/` and `/etc/blkps` move under a private folder, so that
    runs beside each other (and a reader's own /tmp/ps) do not meet;
  - `scripts/build.sh` is not run again: the test runs on the built tree.
Whatever a file's blocks leave running (targets, shards, mounts, background
jobs) is stopped at its end, on failure too.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

README_MAX_LINES = 400
RECIPE_LANGUAGES = ("sh", "python")
FENCE = re.compile(r"^(\s*)```(.*)$")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def doc_files(top):
    return ["README.md"] + sorted(os.path.relpath(p, top) for p in glob.glob(os.path.join(top, "doc", "*.md")))


def read(top, name):
    with open(os.path.join(top, name), encoding="utf-8") as f:
        return f.read()


def blocks(text):
    """Yields (line, info, body) for every fenced block of a markdown text;
    line is the fence's 1-based line number."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).strip()
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j])
        yield i + 1, info, body
        i = j + 1


def outside_fences(text):
    """The text's lines outside fenced blocks, as (line number, line)."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, line


def anchor(heading):
    """GitHub's anchor for a heading line."""
    t = re.sub(r"^#+\s*", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", t).replace(" ", "-")


def anchors(text):
    return {anchor(l) for _, l in outside_fences(text) if re.match(r"^#{1,6} ", l)}


def headings(text):
    """The text's section titles, backquotes left out (a citation in a
    comment names `--bsopts` reference as --bsopts reference)."""
    return {re.sub(r"^#+\s*", "", l).strip().replace("`", "")
            for _, l in outside_fences(text) if re.match(r"^#{1,6} ", l)}


def case_links(top, build):
    problems = []
    readme_lines = read(top, "README.md").count("\n")
    if readme_lines > README_MAX_LINES:
        problems.append(f"README.md has {readme_lines} lines; the front page keeps to {README_MAX_LINES}: "
                        "move reference into doc/")
    for name in doc_files(top):
        text = read(top, name)
        here = os.path.dirname(os.path.join(top, name))
        for n, line in outside_fences(text):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(here, path)) if path else os.path.join(top, name)
                if not os.path.exists(dest):
                    problems.append(f"{name}:{n}: link to {target}: no such file")
                elif frag and dest.endswith(".md") and frag not in anchors(read(top, os.path.relpath(dest, top))):
                    problems.append(f"{name}:{n}: link to {target}: no heading with anchor #{frag}")
        for n, info, _ in blocks(text):
            if not info:
                problems.append(f"{name}:{n}: a fence without an info string; say sh, python, "
                                "sh skip=REASON or text (tests/docs_test.py, 'Fences')")
    if problems:
        fail("\n  ".join([f"{len(problems)} problem(s) in the docs:"] + problems))
    print(f"docs: {len(doc_files(top))} files, every link resolves, README {readme_lines} lines")


# A citation of a section: README "Faults", README, "Status and control",
# doc/server.md "Memory" (the quotes may be escaped inside a string).
CITATION = re.compile(r'(README(?:\.md)?|doc/[\w-]+\.md)(?:\'s)?,? \\?"([^"\\]+)\\?"')
SOURCE_GLOBS = ("*.py", "*.sh", "*.cc", "*.h", "*.hpp", "*.c", "*.txt", "*.cmake", "blkps", "blkps-*")


def case_citations(top, build):
    files = subprocess.run(["git", "-C", top, "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    problems, count = [], 0
    for rel in files:
        base = os.path.basename(rel)
        if rel.endswith(".md") or rel == "tests/docs_test.py" or not any(re.fullmatch(g.replace(".", r"\.").replace("*", ".*"), base)
                                          for g in SOURCE_GLOBS):
            continue
        try:
            text = read(top, rel)
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        # Comments wrap: join a line that ends inside a citation with the next.
        flat = re.sub(r"\n\s*(?://|#|\*)?\s*", " ", text)
        for doc, section in CITATION.findall(flat):
            count += 1
            section = section.replace("`", "")
            doc = "README.md" if doc.startswith("README") else doc
            if not os.path.exists(os.path.join(top, doc)):
                problems.append(f"{rel}: cites {doc} \"{section}\": no such file")
            elif section not in headings(read(top, doc)):
                where = [d for d in doc_files(top) if section in headings(read(top, d))]
                problems.append(f"{rel}: cites {doc} \"{section}\": no such section there"
                                + (f"; it is in {where[0]}" if where else ""))
    if problems:
        fail("\n  ".join([f"{len(problems)} stale citation(s):"] + problems))
    print(f"docs: {count} citations of a section, each names one that exists")


def case_tables(top, build):
    r = subprocess.run([sys.executable, os.path.join(top, "bench", "tables.py"), "--check"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail((r.stderr or r.stdout).strip())
    print("docs: the marked tables of README.md and doc/*.md are bench/results's")


def recipes(top):
    """Every (file, line, info, body) of a sh or python block, in order."""
    for name in doc_files(top):
        for line, info, body in blocks(read(top, name)):
            words = info.split()
            if words and words[0] in RECIPE_LANGUAGES:
                yield name, line, words, body


def localise(body, private):
    body = re.sub(r"(^|[\s;&|(`$])sudo ", r"\1", body)
    body = body.replace("/tmp/", f"{private}/tmp/").replace("/mnt/", f"{private}/mnt/")
    body = body.replace("/etc/blkps", f"{private}/etc/blkps")
    return re.sub(r"(^|\s)scripts/build\.sh\b[^\n;&|]*", r"\1: the tree is built", body)


CLEANUP = r'''
cleanup() {
  status=$?
  set +e
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null; done
  for m in $(awk -v p="$PRIVATE/" 'index($2, p) == 1 {print $2}' /proc/mounts); do fusermount3 -u "$m"; done
  for env in $(find "$PRIVATE" -name target.env 2>/dev/null); do
    "$TOP/scripts/blkps" target stop --dir "$(dirname "$env")" >/dev/null 2>&1
  done
  wait
  exit "$status"
}
trap cleanup EXIT
'''


def case_recipes(top, build):
    by_file = {}
    skipped = []
    for name, line, words, body in recipes(top):
        skip = [w for w in words[1:] if w.startswith("skip=")]
        if skip:
            skipped.append(f"{name}:{line}")
            continue
        by_file.setdefault(name, []).append((line, words[0], body))
    if not by_file:
        fail("no runnable recipe found")
    failed = []
    for name, items in by_file.items():
        private = tempfile.mkdtemp(prefix="blkps-recipes-")
        for d in ("tmp", "mnt", "etc"):
            os.makedirs(os.path.join(private, d))
        script = ["set -euo pipefail", f"TOP={top!r}", f"PRIVATE={private!r}", CLEANUP, 'cd "$TOP"']
        for line, lang, body in items:
            body = localise(body, private)
            script.append(f"echo '--- recipe {name}:{line}' >&2")
            if lang == "python":
                script += ["python3 - <<'RECIPE_EOF'", body, "RECIPE_EOF"]
            else:
                script.append(body)
        # Debian's python3 (with numpy, torch) first, as on the machine README describes.
        env = dict(os.environ, PYTHONPATH=os.path.join(top, "learner", "python"),
                   PATH="/usr/bin:" + os.environ.get("PATH", ""))
        print(f"docs: {name}: {len(items)} recipe(s) (lines {', '.join(str(i[0]) for i in items)})", flush=True)
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=top, env=env, capture_output=True, text=True,
                           timeout=600)
        tail = "\n".join((r.stdout + r.stderr).strip().split("\n")[-25:])
        if r.returncode != 0:
            last = re.findall(r"--- recipe (\S+)", r.stderr)
            failed.append(f"{last[-1] if last else name}: exit {r.returncode}\n{tail}")
            print(f"docs: {name}: FAILED at {last[-1] if last else '?'}\n{tail}", flush=True)
        shutil.rmtree(private, ignore_errors=True)
    print(f"docs: {len(skipped)} recipe(s) marked skip: {', '.join(skipped)}")
    if failed:
        fail(f"{len(failed)} file(s) with a recipe that does not run as pasted:\n" + "\n".join(failed))
    print(f"docs: the runnable recipes of {len(by_file)} file(s) ran")


CASES = {"links": case_links, "citations": case_citations, "tables": case_tables, "recipes": case_recipes}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[3] not in CASES:
        sys.exit(f"usage: docs_test.py TOP BUILD {'|'.join(CASES)}")
    CASES[sys.argv[3]](os.path.abspath(sys.argv[1]), sys.argv[2])
