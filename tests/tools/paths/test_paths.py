"""Workspace confinement (I8): hostile paths are refused and nothing outside is touched."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tools.errors import ToolError
from tools.paths import (
    MAX_SYMLINK_HOPS,
    PathRefused,
    check_relpath,
    digest_of,
    is_dotgit,
    list_dir,
    move,
    open_parent,
    read_bytes,
    remove,
    write_at,
    write_bytes,
)
from tools.reasons import Reason

SECRET = b"outside secret\n"
SIBLING = b"sibling slot secret\n"
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Env:
    root: Path  # everything this test may touch
    work: Path  # slots/S1/work, the tree under test
    sibling: Path  # slots/S2/work, another job's tree
    outside: Path  # a sentinel directory outside every slot


@pytest.fixture
def env(tmp_path: Path) -> Env:
    work = tmp_path / "slots" / "S1" / "work"
    sibling = tmp_path / "slots" / "S2" / "work"
    outside = tmp_path / "outside"
    for d in (work / "sub", work / ".git", sibling, outside):
        d.mkdir(parents=True)
    (outside / "secret").write_bytes(SECRET)
    (sibling / "secret.txt").write_bytes(SIBLING)
    (work / ".git" / "config").write_text("[core]\n")
    (work / "README").write_text("readme\n")
    (work / "sub" / "f.txt").write_text("inner\n")
    return Env(tmp_path, work, sibling, outside)


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under root: kind, content or link target, inode, mode, dir mtime."""
    seen: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames, "."]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            key = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                seen[key] = ("link", os.readlink(p), st.st_ino)
            elif stat.S_ISDIR(st.st_mode):
                seen[key] = ("dir", st.st_ino, st.st_mode, st.st_mtime_ns)
            elif stat.S_ISREG(st.st_mode):
                content = Path(p).read_bytes()
                seen[key] = ("file", content, st.st_ino, st.st_mode, st.st_nlink)
            else:
                seen[key] = ("other", st.st_ino, st.st_mode)
    return seen


OPS: dict[str, Callable[[Path, str], object]] = {
    "read": lambda w, p: read_bytes(w, p, MAX_BYTES),
    "write": lambda w, p: write_bytes(w, p, b"pwned"),
    "remove": remove,
    "list": list_dir,
    "digest": digest_of,
    "move_src": lambda w, p: move(w, p, "moved"),
    "move_dst": lambda w, p: move(w, "README", p),
}


def assert_refused(env: Env, call: Callable[[], object]) -> PathRefused:
    before = snapshot(env.root)
    with pytest.raises(PathRefused) as info:
        call()
    assert info.value.reason == Reason.OUTSIDE_WORKSPACE
    assert snapshot(env.root) == before, "a refused call changed the filesystem"
    assert (env.outside / "secret").read_bytes() == SECRET
    return info.value


# --- hostile spellings: refused by check_relpath, so by every tool -------------------

HOSTILE_PATHS = [
    "",
    "\x00",
    "a\x00b",
    "/etc/passwd",
    "//etc",
    "/",
    "..",
    "../x",
    "a/../../x",
    "./../x",
    "a/./../..",
    "a/..",
    "sub/../README",
    "..\\x",
    "a\\..\\..\\x",
    "sub\\f.txt",
    "a\tb",
    "a\nb",
    "\x1b[31mred",
    "del\x7f",
    "c1\x85",
    "x" * 256,
    "a/" * 2048 + "b",
    "\uff0e\uff0e/x",
    "\u2024\u2024/x",
    "\u2025/x",
    "\u2026",
    "a\u2215..\u2215x",
    "a\u2044b",
    "\uff0fetc/passwd",
    "a\ufe68b",
    "a\u2216b",
    "x\ufe52txt",
    ".git",
    ".git/",
    ".git/hooks/pre-commit",
    ".GIT/config",
    ".Git/HEAD",
    ".git./x",
    ".git /x",
    ".git. . /x",
    ".git::$INDEX_ALLOCATION/config",
    ".git:stream",
    "git~1/config",
    "GIT~1/config",
    "git~2/config",
    ".g\u200cit/config",
    "\ufeff.git/config",
    ".gi\u200dt/HEAD",
    ".\u202egit/config",
    "\uff0egit/config",
    ".\uff47it/config",
    "sub/.git/config",
    "sub/.git",
    "\ud800",
]


@pytest.mark.parametrize("relpath", HOSTILE_PATHS, ids=repr)
def test_hostile_spelling_is_refused_by_every_tool(env: Env, relpath: str) -> None:
    """Each hostile spelling is refused as outside_workspace by every tool, writing nothing."""
    with pytest.raises(PathRefused):
        check_relpath(relpath)
    for op in OPS.values():
        assert_refused(env, functools.partial(op, env.work, relpath))


def test_refusal_message_names_the_problem() -> None:
    """The refusal says what is wrong with the path."""
    cases = {
        "": "empty",
        "a\x00": "NUL",
        "/etc": "absolute",
        "a/../b": "'..'",
        "a\\b": "backslash",
        "a\tb": "control character U+0009",
        "\u2215x": "U+2215 DIVISION SLASH",
        ".GIT/config": ".git",
        "x" * 300: "255 bytes",
    }
    for relpath, expected in cases.items():
        with pytest.raises(PathRefused) as info:
            check_relpath(relpath)
        assert expected in info.value.message, (relpath, info.value.message)


@pytest.mark.parametrize(
    ("relpath", "parts"),
    [
        ("a/b", ("a", "b")),
        ("a/./b", ("a", "b")),
        ("a//b/", ("a", "b")),
        (".", ()),
        ("./", ()),
        ("...", ("...",)),
        ("a/.../b", ("a", "...", "b")),
        ("..a", ("..a",)),
        (".gitignore", (".gitignore",)),
        (".gitmodules", (".gitmodules",)),
        (".github/workflows/ci.yml", (".github", "workflows", "ci.yml")),
        (".gitx", (".gitx",)),
        ("git~", ("git~",)),
        ("git", ("git",)),
        ("café/日本.txt", ("café", "日本.txt")),
        ("½.txt", ("½.txt",)),
        ("a b", ("a b",)),
        ("x" * 255, ("x" * 255,)),
    ],
)
def test_ordinary_paths_are_split(relpath: str, parts: tuple[str, ...]) -> None:
    """Ordinary names pass; '.' and empty components are dropped; '...' is a plain name."""
    assert check_relpath(relpath) == parts


def test_is_dotgit_follows_git() -> None:
    """Names git treats as .git are recognised, ordinary dot-names are not."""
    assert all(is_dotgit(n) for n in [".git", ".GiT", ".git..", "git~1", ".g\u200fit"])
    assert not any(is_dotgit(n) for n in [".gitignore", "git", ".git-x", "my.git", "agit~1"])


# --- hostile trees: symlinks and hard links ------------------------------------------


def _links(**links: str) -> Callable[[Env], None]:
    """A setup making symlinks in work; '{O}' '{W}' '{R}' expand to outside/work/root."""

    def setup(env: Env) -> None:
        for name, target in links.items():
            path = env.work / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            t = target.format(O=env.outside, W=env.work, R=env.root)
            os.symlink(t, path)

    return setup


def _hardlink(env: Env) -> None:
    os.link(env.outside / "secret", env.work / "hl")


def _work2(env: Env) -> None:
    twin = env.work.parent / "work2"  # shares the string prefix of the work root
    twin.mkdir()
    (twin / "secret").write_bytes(SECRET)
    os.symlink(twin, env.work / "w2")


TREE_CASES: list[tuple[str, Callable[[Env], None], str, str]] = [
    ("etc_read", _links(etc="/etc"), "read", "etc/passwd"),
    ("etc_list", _links(etc="/etc"), "list", "etc"),
    ("etc_digest", _links(etc="/etc"), "digest", "etc/passwd"),
    ("out_dir_read", _links(out="{O}"), "read", "out/secret"),
    ("out_dir_write_new", _links(out="{O}"), "write", "out/new"),
    ("out_dir_write_existing", _links(out="{O}"), "write", "out/secret"),
    ("out_dir_write_nested", _links(out="{O}"), "write", "out/a/b/c"),
    ("out_dir_as_last", _links(out="{O}"), "write", "out"),
    ("out_dir_remove", _links(out="{O}"), "remove", "out/secret"),
    ("out_dir_list", _links(out="{O}"), "list", "out"),
    ("out_dir_move_src", _links(out="{O}"), "move_src", "out/secret"),
    ("out_dir_move_dst", _links(out="{O}"), "move_dst", "out/new"),
    ("out_file_read", _links(f="{O}/secret"), "read", "f"),
    ("out_file_overwrite", _links(f="{O}/secret"), "write", "f"),
    ("out_file_digest", _links(f="{O}/secret"), "digest", "f"),
    ("out_file_remove_link", _links(f="{O}/secret"), "remove", "f"),
    ("out_file_move_link", _links(f="{O}/secret"), "move_src", "f"),
    ("out_file_replace_link", _links(f="{O}/secret"), "move_dst", "f"),
    ("dangling_out_write", _links(d="{O}/new"), "write", "d"),
    ("relative_out_file", _links(r="../../../outside/secret"), "read", "r"),
    ("relative_up_up", _links(up="../.."), "list", "up"),
    ("relative_up_read", _links(up="../.."), "read", "up/S2/work/secret.txt"),
    ("nested_up", _links(sub__esc="../.."), "read", "sub/esc/S1/work/README"),
    ("chain_out", _links(c1="c2", c2="sub/c3", sub__c3="../../../../outside"), "read", "c1/secret"),
    ("chain_out_write", _links(c1="c2", c2="{O}"), "write", "c1/new"),
    ("through_inner_dir", _links(s="sub", sub__up="../.."), "read", "s/up/outside/secret"),
    ("sibling_rel_read", _links(sib="../../S2/work"), "read", "sib/secret.txt"),
    ("sibling_rel_write", _links(sib="../../S2/work"), "write", "sib/secret.txt"),
    ("sibling_abs_write", _links(sib="{R}/slots/S2/work"), "write", "sib/new.txt"),
    ("sibling_abs_list", _links(sib="{R}/slots/S2/work"), "list", "sib"),
    ("abs_root_then_up", _links(p="{W}/../../S2/work"), "read", "p/secret.txt"),
    ("prefix_twin", _work2, "read", "w2/secret"),
    ("missing_then_up", _links(m="missing/../../../../outside/new"), "write", "m"),
    ("file_then_up", _links(t="README/../../../../outside/new"), "write", "t"),
    ("missing_dir_link", _links(m="gone/../../x"), "write", "m/y"),
    ("loop", _links(l1="l2", l2="l1"), "read", "l1"),
    ("self_loop_write", _links(me="me"), "write", "me"),
    ("link_to_dotgit", _links(g=".git"), "read", "g/config"),
    ("link_to_dotgit_write", _links(g=".git"), "write", "g/hooks/pre-commit"),
    ("link_to_dotgit_case", _links(g="sub/../.GIT"), "list", "g"),
    ("link_to_dotgit_abs", _links(g="{W}/.git/config"), "read", "g"),
    ("proc_root", _links(pr="/proc/self/root"), "list", "pr"),
    ("hardlink_read", _hardlink, "read", "hl"),
    ("hardlink_write", _hardlink, "write", "hl"),
    ("hardlink_digest", _hardlink, "digest", "hl"),
    ("hardlink_remove", _hardlink, "remove", "hl"),
    ("hardlink_move", _hardlink, "move_src", "hl"),
    ("hardlink_replace", _hardlink, "move_dst", "hl"),
]


@pytest.mark.parametrize(
    ("setup", "op", "relpath"),
    [c[1:] for c in TREE_CASES],
    ids=[c[0] for c in TREE_CASES],
)
def test_hostile_tree_is_refused(
    env: Env, setup: Callable[[Env], None], op: str, relpath: str
) -> None:
    """Symlinks leading out (or into .git), loops and hard links refuse the call, untouched."""
    setup(env)
    assert_refused(env, lambda: OPS[op](env.work, relpath))


def test_symlink_loop_names_the_hop_limit(env: Env) -> None:
    """A symlink loop is refused with a message naming the hop limit."""
    _links(l1="l2", l2="l1")(env)
    err = assert_refused(env, lambda: read_bytes(env.work, "l1", MAX_BYTES))
    assert str(MAX_SYMLINK_HOPS) in err.message


def test_moving_a_relative_link_where_it_would_point_out_is_refused(env: Env) -> None:
    """A link that points inside from sub/ but out from the root is not moved to the root."""
    _links(sub__l="../README")(env)
    assert read_bytes(env.work, "sub/l", MAX_BYTES) == b"readme\n"
    assert_refused(env, lambda: move(env.work, "sub/l", "l2"))


def test_fifo_is_refused_not_read(env: Env) -> None:
    """A FIFO (or device) is refused instead of blocking or reading a foreign stream."""
    os.mkfifo(env.work / "pipe")
    assert_refused(env, lambda: read_bytes(env.work, "pipe", MAX_BYTES))


def test_work_root_that_is_a_symlink_is_refused(env: Env) -> None:
    """A work root swapped for a symlink is not entered."""
    fake = env.root / "slots" / "S3" / "work"
    fake.parent.mkdir()
    os.symlink(env.sibling, fake)
    # O_DIRECTORY|O_NOFOLLOW on the root itself: the link is not a directory to enter.
    with pytest.raises(NotADirectoryError) as info:
        read_bytes(fake, "secret.txt", MAX_BYTES)
    assert info.value.filename == str(fake)


# --- swaps between the check and the write -------------------------------------------


def test_directory_swapped_for_symlink_after_check_write_stays_inside(env: Env) -> None:
    """The write lands in the directory that was checked, never in the swapped-in target."""
    (env.work / "d").mkdir()
    with open_parent(env.work, "d/x") as (dir_fd, name):
        os.rename(env.work / "d", env.work / "d_old")
        os.symlink(env.outside, env.work / "d")
        write_at(dir_fd, name, b"data", "d/x")
    assert (env.work / "d_old" / "x").read_bytes() == b"data"
    assert sorted(os.listdir(env.outside)) == ["secret"]


def test_last_component_swapped_for_outward_symlink_is_refused(env: Env) -> None:
    """A file replaced by an outward symlink after the check is refused, not written through."""
    with open_parent(env.work, "sub/f.txt") as (dir_fd, name):
        os.unlink(env.work / "sub" / "f.txt")
        os.symlink(env.outside / "secret", env.work / "sub" / "f.txt")
        with pytest.raises(PathRefused, match=r"'sub/f\.txt' is not a regular file"):
            write_at(dir_fd, name, b"pwned", "sub/f.txt")
    assert (env.outside / "secret").read_bytes() == SECRET
    assert os.readlink(env.work / "sub" / "f.txt") == str(env.outside / "secret")


def test_racing_symlink_swap_never_writes_outside(env: Env) -> None:
    """While another thread flips a directory and an outward symlink, no write escapes."""
    race, parked = env.work / "race", env.work / "parked"
    race.mkdir()
    stop = threading.Event()

    steps: list[Callable[[], None]] = [
        lambda: os.rename(race, parked),
        lambda: os.symlink(env.outside, race),
        lambda: os.unlink(race),
        lambda: os.rename(parked, race),
    ]

    def flip() -> None:
        while not stop.is_set():
            for step in steps:
                with contextlib.suppress(OSError):  # the other side may have moved on
                    step()

    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes: Counter[str] = Counter()
    try:
        for i in range(400):
            try:
                write_bytes(env.work, f"race/f{i}", b"x")
                outcomes["written"] += 1
            except (ToolError, FileNotFoundError) as exc:
                outcomes[type(exc).__name__] += 1
    finally:
        stop.set()
        flipper.join(timeout=30)
    assert not flipper.is_alive()
    assert sorted(os.listdir(env.outside)) == ["secret"]
    assert (env.outside / "secret").read_bytes() == SECRET
    found = [p for p in env.work.rglob("f*") if p.name[1:].isdigit() and p.is_file()]
    assert len(found) == outcomes["written"], outcomes


# --- ordinary use ---------------------------------------------------------------------


def test_write_then_read_creates_parents(env: Env) -> None:
    """A write creates missing parent directories inside the tree and reads back."""
    write_bytes(env.work, "new/deep/file.txt", b"hello")
    assert read_bytes(env.work, "new/deep/file.txt", MAX_BYTES) == b"hello"
    assert (env.work / "new" / "deep" / "file.txt").read_bytes() == b"hello"


def test_overwrite_is_atomic_and_keeps_mode(env: Env) -> None:
    """Overwriting replaces the inode (atomic rename), keeps the mode, leaves no temp file."""
    script = env.work / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    ino = script.stat().st_ino
    write_bytes(env.work, "run.sh", b"new")
    assert script.read_bytes() == b"new"
    assert script.stat().st_ino != ino
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert not [n for n in os.listdir(env.work) if "tmp" in n]


def test_read_larger_than_limit_is_too_large(env: Env) -> None:
    """A file over max_bytes is refused with reason too_large."""
    with pytest.raises(ToolError, match="'README' is larger than 3 bytes") as info:
        read_bytes(env.work, "README", 3)
    assert info.value.reason == Reason.TOO_LARGE
    assert read_bytes(env.work, "README", 7) == b"readme\n"


def test_absent_files(env: Env) -> None:
    """Absent files raise FileNotFoundError on read and remove; digest_of gives None."""
    for relpath in ("nope", "sub/nope", "nodir/x", "README/x"):
        # The tool's own answer, naming the path: not the OS's for a missing work root.
        with pytest.raises(FileNotFoundError, match="no such file in the work tree") as info:
            read_bytes(env.work, relpath, MAX_BYTES)
        assert info.value.filename == relpath
        with pytest.raises(FileNotFoundError, match="no such file in the work tree") as info:
            remove(env.work, relpath)
        assert info.value.filename == relpath
        assert digest_of(env.work, relpath) is None


def test_digest_of_is_sha256_of_content(env: Env) -> None:
    """digest_of is the sha256 hex of the file's bytes."""
    assert digest_of(env.work, "sub/f.txt") == hashlib.sha256(b"inner\n").hexdigest()


def test_directories_are_not_files(env: Env) -> None:
    """Reading, writing or removing a directory is a clear ToolError, not a refusal."""
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: read_bytes(env.work, "sub", MAX_BYTES), "'sub' is a directory"),
        (lambda: write_bytes(env.work, "sub", b"x"), "'sub' is a directory"),
        (lambda: remove(env.work, "sub"), "'sub' is a directory; rm removes files only"),
        (lambda: write_bytes(env.work, "README/x", b"x"), "'README' is not a directory"),
        (lambda: list_dir(env.work, "README"), "'README' is not a directory"),
    ]
    for call, problem in calls:
        with pytest.raises(ToolError, match=problem) as info:
            call()
        assert info.value.reason == Reason.MALFORMED
    assert (env.work / "sub" / "f.txt").exists()
    assert (env.work / "README").read_text() == "readme\n"


def test_remove_file_and_inside_link(env: Env) -> None:
    """rm removes a file, and a symlink pointing inside is removed itself, not its target."""
    _links(l="sub/f.txt")(env)
    remove(env.work, "l")
    assert not os.path.lexists(env.work / "l")
    assert (env.work / "sub" / "f.txt").exists()
    remove(env.work, "sub/f.txt")
    assert not (env.work / "sub" / "f.txt").exists()


def test_move_file_into_new_dir_and_over_existing(env: Env) -> None:
    """mv renames a file into new directories, and over an existing file."""
    move(env.work, "README", "docs/README.md")
    assert (env.work / "docs" / "README.md").read_text() == "readme\n"
    move(env.work, "sub/f.txt", "docs/README.md")
    assert (env.work / "docs" / "README.md").read_text() == "inner\n"
    move(env.work, "docs", "documentation")
    assert (env.work / "documentation" / "README.md").exists()
    with pytest.raises(ToolError, match="cannot move 'documentation' into itself") as info:
        move(env.work, "documentation", "documentation/inner")
    assert info.value.reason == Reason.MALFORMED
    with pytest.raises(FileNotFoundError, match="no such file in the work tree"):
        move(env.work, "nope", "x")


def test_list_dir_sorted_without_dotgit(env: Env) -> None:
    """list_dir is sorted by name, omits .git, and reports type and size."""
    _links(l="sub")(env)
    expected = [
        {"name": "README", "type": "file", "size": 7},
        {"name": "l", "type": "symlink", "size": 0},
        {"name": "sub", "type": "dir", "size": 0},
    ]
    assert list_dir(env.work, ".") == expected
    assert list_dir(env.work, "l") == [{"name": "f.txt", "type": "file", "size": 6}]
    with pytest.raises(FileNotFoundError, match="no such file in the work tree"):
        list_dir(env.work, "nope")


def test_symlinks_inside_are_followed(env: Env) -> None:
    """Relative, nested and absolute symlinks that stay inside are followed for read/write."""
    _links(l="sub", sub__up="../README", a="{W}/sub", lf="sub/f.txt", dang="sub/made")(env)
    assert read_bytes(env.work, "l/f.txt", MAX_BYTES) == b"inner\n"
    assert read_bytes(env.work, "sub/up", MAX_BYTES) == b"readme\n"
    assert read_bytes(env.work, "a/f.txt", MAX_BYTES) == b"inner\n"
    write_bytes(env.work, "l/new", b"n")
    assert (env.work / "sub" / "new").read_bytes() == b"n"
    write_bytes(env.work, "lf", b"through")
    assert (env.work / "sub" / "f.txt").read_bytes() == b"through"
    assert os.path.islink(env.work / "lf")
    write_bytes(env.work, "dang", b"made")
    assert (env.work / "sub" / "made").read_bytes() == b"made"
    assert digest_of(env.work, "l/new") == hashlib.sha256(b"n").hexdigest()


def test_triple_dot_is_an_ordinary_name(env: Env) -> None:
    """'...' is a plain file name on POSIX (git accepts it too), so it is allowed."""
    write_bytes(env.work, ".../x", b"dots")
    assert (env.work / "..." / "x").read_bytes() == b"dots"
    assert read_bytes(env.work, ".../x", MAX_BYTES) == b"dots"


def test_writing_the_root_is_refused(env: Env) -> None:
    """The work tree itself cannot be written, removed or moved."""
    assert_refused(env, lambda: write_bytes(env.work, ".", b"x"))
    assert_refused(env, lambda: remove(env.work, "./"))
    assert_refused(env, lambda: move(env.work, ".", "x"))
