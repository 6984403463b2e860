"""The external programs tandem's own code calls, found by reading the code.

Shell (the launcher, scripts/, shell text embedded in Python) is parsed with
tree-sitter-bash; Python with `ast`. What counts as a call:

- shell: a command's name, and the command a wrapper runs (`exec`, `sudo`/`$SUDO`,
  `env`, `nice`, `timeout`, `unshare`, `chroot`'s own name, `flock FILE CMD`,
  `xargs`, `command`, and the script's own functions that run "$@");
- Python: the literal program of `subprocess.*` / `os.exec*` calls (a module-level
  string constant counts as a literal), `sh -c TEXT` parsed as shell, and the names
  asked of `tandem.setup.programs` (`require`, `which`) or `shutil.which`.

A program is *guarded* in a file when the file checks for it before use (`command -v
X`, `shutil.which("X")`, `programs.which("X")`): the code then has a fallback.
Dynamic names (`"$CC"`, `${MAKE[@]}`, a path from a build's JSON) and relative paths
(the project's own scripts) are not external programs and are skipped.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

_PARSER = Parser(Language(tree_sitter_bash.language()))

# bash builtins and keywords (bash 5.2, `compgen -b -k`): not programs.
BUILTINS = frozenset("""
. : [ [[ alias bg bind break builtin caller cd command compgen complete compopt continue
declare dirs disown echo enable eval exec exit export false fc fg getopts hash help
history jobs kill let local logout mapfile popd printf pushd pwd read readarray
readonly return set shift shopt source suspend test times trap true type typeset
ulimit umask unalias unset wait
""".split())

# Wrappers: how many leading non-option words they take before the command they run.
# chroot's command runs inside another root (not this host's program): None = stop.
WRAPPERS = {"exec": 0, "sudo": 0, "$SUDO": 0, "env": 0, "nice": 0, "ionice": 0, "nohup": 0,
            "setsid": 0, "stdbuf": 0, "time": 0, "xargs": 0, "timeout": 1, "flock": 1,
            "unshare": 0, "chroot": None, "command": 0, "taskset": 1, "chrt": 1}
GUARDS = ("command -v", "command -V", "type -P", "hash")
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
EXECS = {"execv", "execve", "execvp", "execvpe", "execl", "execlp", "execle", "execlpe", "spawnvp"}


@dataclass
class Calls:
    """Programs a file calls: name -> line numbers, and those it checks for first."""
    path: Path
    used: dict[str, list[int]] = field(default_factory=dict)
    guarded: set[str] = field(default_factory=set)

    def add(self, name: str, line: int) -> None:
        self.used.setdefault(name, []).append(line)


def _program(word: str) -> str | None:
    """The program a literal command word names, or None (dynamic, or the project's own)."""
    if not word or any(c in word for c in "$`\"'(){}*?") or "=" in word:
        return None
    if "/" in word:
        return word.rsplit("/", 1)[1] if word.startswith(("/usr/", "/bin/", "/sbin/")) else None
    return word


def _words(cmd: Node) -> list[tuple[str, int]]:
    """A command's words after its name, with their lines (redirections excluded)."""
    return [(c.text.decode(), c.start_point[0] + 1) for c in cmd.children_by_field_name("argument")]


def _walk(n: Node):
    yield n
    for c in n.children:
        yield from _walk(c)


def _wrapped(name: str, args: list[tuple[str, int]]) -> int | None:
    """Where in args the command a wrapper runs is: after its options and leading operands."""
    skip = WRAPPERS[name]
    if skip is None:
        return None
    words = [w for w, _ in args]
    if name == "command" and words[:1] in (["-v"], ["-V"]):
        return None
    if name == "flock" and len([w for w in words if not w.startswith("-")]) < 2:
        return None   # flock FD: takes a lock, runs nothing
    if "--" in words:
        i = words.index("--") + 1
        return i if i < len(words) else None
    i = 0
    while i < len(words) and (words[i].startswith("-") or name == "env" and "=" in words[i]):
        i += 1
    i += skip
    return i if i < len(words) else None


def scan_argv(argv: list[tuple[str, int]], calls: Calls, runners: frozenset[str] = frozenset(),
              functions: frozenset[str] = frozenset()) -> None:
    """Add the programs one command line runs: its own, a wrapper's, `sh -c TEXT`'s."""
    while argv:
        (word, line), args = argv[0], argv[1:]
        if word in runners and args:
            argv = args
            continue
        prog = "sudo" if word == "$SUDO" else _program(word)
        if prog and prog not in BUILTINS and prog not in functions:
            calls.add(prog, line)
        if prog in ("sh", "bash") and [w for w, _ in args[:1]] == ["-c"] and len(args) > 1:
            script = args[1][0]
            if len(script) > 1 and script[0] == script[-1] == "'":   # a quoted shell word
                script = script[1:-1]
            scan_shell(script, calls, args[1][1] - 1)
            return
        if word not in WRAPPERS and prog not in WRAPPERS:
            return
        i = _wrapped(prog if prog in WRAPPERS else word, args)
        if i is None:
            return
        argv = args[i:]


def _sourced(root: Node, path: Path) -> frozenset[str]:
    """Functions of the files a script sources (`. "$HERE/progress.sh"`), found next to it."""
    names: set[str] = set()
    for n in _walk(root):
        if n.type == "command" and n.child_by_field_name("name").text.decode() in (".", "source"):
            args = _words(n)
            other = path.parent / args[0][0].strip("\"'").rsplit("/", 1)[-1] if args else None
            if other and other.is_file() and other != path:
                tree = _PARSER.parse(other.read_bytes()).root_node
                names |= {f.child_by_field_name("name").text.decode()
                          for f in _walk(tree) if f.type == "function_definition"}
    return frozenset(names)


def scan_shell(text: str, calls: Calls, line0: int = 0) -> None:
    """Add the programs a shell text calls (line numbers offset by line0)."""
    root = _PARSER.parse(text.encode()).root_node
    functions = frozenset(n.child_by_field_name("name").text.decode()
                          for n in _walk(root) if n.type == "function_definition") | _sourced(root, calls.path)
    # Functions that run their arguments ("$@" as a command name): run gcc ... runs gcc.
    runners = frozenset(
        n.child_by_field_name("name").text.decode() for n in _walk(root)
        if n.type == "function_definition"
        and any(c.type == "command" and c.child_by_field_name("name").text.decode() == '"$@"'
                for c in _walk(n.child_by_field_name("body"))))
    for n in _walk(root):
        if n.type == "command":
            name = n.child_by_field_name("name")
            argv = [(name.text.decode(), name.start_point[0] + 1)] + _words(n)
            words = [w for w, _ in argv]
            # A check for a program is a use of it too (KCC="ccache gcc" after command -v ccache).
            if words[:2] in (["command", "-v"], ["command", "-V"], ["type", "-P"]) and len(words) > 2 \
                    or words[:1] == ["hash"] and len(words) > 1:
                checked = _program(words[-1])
                if checked:
                    calls.guarded.add(checked)
                    calls.add(checked, argv[-1][1] + line0)
            scan_argv([(w, l + line0) for w, l in argv], calls, runners, functions)


def _literal(node: ast.AST, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _call_name(func: ast.AST) -> tuple[str, str]:
    """(owner, attribute) of a call: subprocess.run -> ("subprocess", "run")."""
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        return owner, func.attr
    if isinstance(func, ast.Name):
        return "", func.id
    return "", ""


def scan_python(text: str, calls: Calls) -> None:
    """Add the programs a Python module calls."""
    tree = ast.parse(text)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call) or not n.args:
            continue
        owner, attr = _call_name(n.func)
        first = n.args[0]
        if (owner, attr) in (("shutil", "which"), ("programs", "which")) or attr in ("which", "require") \
                and owner == "programs":
            name = _literal(first, consts)
            if name:
                calls.add(name, n.lineno)
                if attr == "which":
                    calls.guarded.add(name)
            continue
        if not ((owner == "subprocess" and attr in SUBPROCESS) or (owner == "os" and attr in EXECS)
                or attr in ("Popen", "create_subprocess_exec")):
            continue
        if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
            argv = [_literal(e, consts) for e in first.elts]
        elif owner == "os" and attr in EXECS:
            argv = [_literal(first, consts)]
        else:
            text_arg = _literal(first, consts)   # a string command: shell=True
            if text_arg is not None:
                scan_shell(text_arg, calls, n.lineno - 1)
            continue
        # A word that is not a literal is dynamic: "$?" is no program.
        scan_argv([(w if w is not None else "$?", n.lineno) for w in argv], calls)


def scan(path: Path) -> Calls:
    calls = Calls(path)
    text = path.read_text()
    if path.suffix == ".py":
        scan_python(text, calls)
    else:
        scan_shell(text, calls)
    return calls


def host_code(root: Path) -> list[Path]:
    """Every file of tandem that runs on the host: the launcher, CI, scripts/, the
    Python package, tests and benchmarks (agent/ runs in the guest)."""
    files = [root / "tandem", root / ".ci" / "run", *sorted((root / "scripts").glob("*.sh")),
             *sorted((root / "scripts").glob("*.py"))]
    for top in ("replay", "tests", "bench"):
        files += sorted(p for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)
    return files
