"""The filesystem module: reads, writes and listings that stay under the workspace root."""

from __future__ import annotations

import os

import pytest

from turnstile.tools.modules.filesystem import (
    POLICIES,
    FilesystemConfig,
    PathOutsideRoot,
    Sandbox,
    register_filesystem_module,
)
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


@pytest.fixture
def root(tmp_path):
    return tmp_path / "root"


@pytest.fixture
def outside(tmp_path):
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("top secret")
    return secret


def make_tools(root, **config):
    registry = ToolRegistry(PolicyTable({"filesystem.*": "AUTO"}))
    register_filesystem_module(registry, FilesystemConfig(root=str(root), **config))

    async def call(name, **arguments):
        return await registry.call("s", "ada", name, arguments)

    return call


async def test_write_read_and_list(root):
    call = make_tools(root)
    written = await call(
        "filesystem.write", path="notes/a.txt", content="héllo", create_parents=True
    )
    assert written.ok, written.error
    assert written.data == {"path": "notes/a.txt", "bytes_written": 6, "mode": "overwrite"}
    read = await call("filesystem.read", path="notes/a.txt")
    assert read.data == {
        "path": "notes/a.txt",
        "size": 6,
        "content": "héllo",
        "encoding": "utf-8",
        "truncated": False,
    }
    assert (await call("filesystem.write", path="notes/a.txt", content="!", mode="append")).ok
    assert (root / "notes/a.txt").read_text() == "héllo!"
    assert (
        await call("filesystem.write", path="notes/b.bin", content="AAEC/w==", encoding="base64")
    ).ok
    binary = await call("filesystem.read", path="notes/b.bin")
    assert (binary.data["encoding"], binary.data["content"]) == ("base64", "AAEC/w==")
    (root / "notes/sub").mkdir()
    listing = await call("filesystem.list", path="notes")
    assert listing.data == {
        "path": "notes",
        "entries": [
            {"name": "a.txt", "type": "file", "size": 7},
            {"name": "b.bin", "type": "file", "size": 4},
            {"name": "sub", "type": "dir", "size": None},
        ],
        "total": 3,
        "truncated": False,
    }
    top = await call("filesystem.list")
    assert top.data["path"] == "."
    assert [e["name"] for e in top.data["entries"]] == ["notes"]


async def test_write_modes(root):
    call = make_tools(root)
    assert (await call("filesystem.write", path="x.txt", content="1", mode="create")).ok
    again = await call("filesystem.write", path="x.txt", content="2", mode="create")
    assert (again.error["code"], again.error["message"]) == ("file_error", "'x.txt' already exists")
    assert (root / "x.txt").read_text() == "1"
    missing_parent = await call("filesystem.write", path="no/such/x.txt", content="1")
    assert missing_parent.error["code"] == "not_found"
    (root / "d").mkdir()
    onto_dir = await call("filesystem.write", path="d", content="1")
    assert onto_dir.error == {
        "code": "file_error",
        "message": "'d' is a directory",
        "field": "path",
    }
    bad = await call("filesystem.write", path="y", content="%%%", encoding="base64")
    assert (bad.error["code"], bad.error["field"]) == ("invalid_argument", "content")
    assert sorted(os.listdir(root)) == ["d", "x.txt"]  # no temporary files left behind


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../x", "path '../x' leads outside the workspace root"),
        ("a/../../x", "path 'a/../../x' leads outside the workspace root"),
        ("/etc/passwd", "absolute path '/etc/passwd' is not allowed"),
        ("..", "path '..' leads outside the workspace root"),
    ],
)
async def test_traversal_is_refused(root, path, message):
    call = make_tools(root)
    for name, arguments in (
        ("filesystem.read", {"path": path}),
        ("filesystem.write", {"path": path, "content": "x"}),
        ("filesystem.list", {"path": path}),
    ):
        result = await call(name, **arguments)
        assert result.error["code"] == "path_outside_root", (name, result)
        assert result.error["message"].startswith(message)
        assert result.error["field"] == "path"


async def test_paths_that_stay_inside_are_fine(root):
    call = make_tools(root)
    assert (await call("filesystem.write", path="a/../b.txt", content="ok")).ok
    assert (root / "b.txt").read_text() == "ok"
    assert (await call("filesystem.read", path="./b.txt")).data["path"] == "b.txt"


async def test_symlinks_leading_outside_are_refused_for_read_and_write(root, outside):
    call = make_tools(root)
    os.symlink(outside / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    os.symlink(outside / "new.txt", root / "dangling.txt")
    for path in ("link.txt", "linkdir/secret.txt", "dangling.txt", "linkdir/new.txt"):
        read = await call("filesystem.read", path=path)
        assert read.error["code"] == "path_outside_root", (path, read)
        assert "through a symlink" in read.error["message"]
        write = await call("filesystem.write", path=path, content="pwned")
        assert write.error["code"] == "path_outside_root", (path, write)
        append = await call("filesystem.write", path=path, content="pwned", mode="append")
        assert append.error["code"] == "path_outside_root", (path, append)
    listed = await call("filesystem.list", path="linkdir")
    assert listed.error["code"] == "path_outside_root"
    assert (outside / "secret.txt").read_text() == "top secret"
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    entries = (await call("filesystem.list")).data["entries"]
    assert {e["name"]: e["type"] for e in entries} == {
        "dangling.txt": "symlink",
        "link.txt": "symlink",
        "linkdir": "symlink",
    }


async def test_symlinks_inside_the_root_work(root):
    call = make_tools(root)
    assert (await call("filesystem.write", path="real/f.txt", content="in", create_parents=True)).ok
    os.symlink("real", root / "alias")
    read = await call("filesystem.read", path="alias/f.txt")
    assert read.data["content"] == "in"
    assert read.data["path"] == "real/f.txt"


def test_the_open_walk_refuses_a_symlink_swapped_in_after_the_check(root, outside):
    sandbox = Sandbox(root)
    (root / "d").mkdir()
    target = sandbox.resolve("d/secret.txt")  # checked while d is a directory
    (root / "d").rmdir()
    os.symlink(outside, root / "d")  # ... then swapped for a symlink
    with pytest.raises(PathOutsideRoot):
        sandbox.open_file(target, os.O_RDONLY)
    (root / "f.txt").write_text("x")
    final = sandbox.resolve("f.txt")
    (root / "f.txt").unlink()
    os.symlink(outside / "secret.txt", root / "f.txt")
    with pytest.raises(PathOutsideRoot, match="became a symlink"):
        sandbox.open_file(final, os.O_WRONLY | os.O_TRUNC)
    assert (outside / "secret.txt").read_text() == "top secret"


async def test_size_limits(root):
    call = make_tools(root, max_read_bytes=10, max_write_bytes=8)
    too_big = await call("filesystem.write", path="a.txt", content="x" * 9)
    assert (too_big.error["code"], too_big.error["field"]) == ("limit_exceeded", "content")
    (root / "big.txt").write_text("0123456789abcdef")
    read = await call("filesystem.read", path="big.txt")
    assert read.data["content"] == "0123456789"
    assert (read.data["truncated"], read.data["size"]) == (True, 16)
    few = await call("filesystem.read", path="big.txt", max_bytes=4)
    assert few.data["content"] == "0123"
    over = await call("filesystem.read", path="big.txt", max_bytes=11)
    assert (over.error["code"], over.error["field"]) == ("invalid_argument", "max_bytes")
    (root / "utf8.txt").write_bytes("aaaaaaaaaé".encode())  # é straddles the 10-byte limit
    cut = await call("filesystem.read", path="utf8.txt")
    assert (cut.data["content"], cut.data["encoding"]) == ("aaaaaaaaa", "utf-8")


async def test_list_limits_and_errors(root):
    call = make_tools(root, max_list_entries=2)
    for name in "cab":
        (root / name).mkdir(parents=True)
    listing = await call("filesystem.list")
    assert [e["name"] for e in listing.data["entries"]] == ["a", "b"]
    assert (listing.data["total"], listing.data["truncated"]) == (3, True)
    (root / "f.txt").write_text("x")
    not_dir = await call("filesystem.list", path="f.txt")
    assert not_dir.error["code"] == "file_error"
    missing = await call("filesystem.read", path="nope.txt")
    assert missing.error == {
        "code": "not_found",
        "message": "no such file or directory: 'nope.txt'",
        "field": "path",
    }
    is_dir = await call("filesystem.read", path="a")
    assert is_dir.error["message"] == "'a' is a directory"
    os.mkfifo(root / "fifo")
    fifo = await call("filesystem.read", path="fifo")  # must not hang
    assert fifo.error["message"] == "'fifo' is not a regular file"


async def test_policies_are_data(root):
    registry = ToolRegistry()
    register_filesystem_module(registry, FilesystemConfig(root=str(root)))
    assert POLICIES == {
        "filesystem.read": "AUTO",
        "filesystem.list": "AUTO",
        "filesystem.write": "APPROVE",
    }
    assert registry.policy_of("filesystem.write") is Policy.APPROVE
    refused = await registry.call("s", "ada", "filesystem.write", {"path": "x", "content": "y"})
    assert refused.error["code"] == "requires_approval"
    assert not (root / "x").exists()
