"""Prechecks: a call that would be refused anyway is refused before a person is asked to
approve it (a write outside the workspace, a download to a bad path, a malformed request)."""

from __future__ import annotations

import msgspec

from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.modules.filesystem import FilesystemConfig, register_filesystem_module
from turnstile.tools.modules.http import HttpConfig, register_http_module
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


class Asked:
    """An approver that records what it was asked and approves everything."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def __call__(self, call, name, arguments) -> bool:
        self.calls.append((name, arguments))
        return True


def tools(tmp_path) -> tuple[ToolRegistry, Asked]:
    asked = Asked()
    registry = ToolRegistry(PolicyTable({"filesystem.*": "APPROVE"}), approver=asked)
    module = register_filesystem_module(registry, FilesystemConfig(root=str(tmp_path / "root")))
    register_http_module(registry, HttpConfig(), sandbox=module.sandbox)
    return registry, asked


async def test_a_write_outside_the_root_fails_with_the_path_error_and_asks_nobody(tmp_path):
    registry, asked = tools(tmp_path)
    for path, message in (
        ("../etc/x", "path '../etc/x' leads outside the workspace root"),
        (
            "/etc/x",
            "absolute path '/etc/x' is not allowed; paths are relative to the workspace root",
        ),
    ):
        result = await registry.call("s", "ada", "filesystem.write", {"path": path, "content": "x"})
        assert (result.ok, result.error) == (
            False,
            {"code": "path_outside_root", "message": message, "field": "path"},
        )
    bad = await registry.call(
        "s", "ada", "filesystem.write", {"path": "a", "content": "%%", "encoding": "base64"}
    )
    assert bad.error == {
        "code": "invalid_argument",
        "message": "content is not valid base64",
        "field": "content",
    }
    assert asked.calls == []
    assert not (tmp_path / "etc").exists()


async def test_a_valid_write_is_still_asked_about_and_then_runs(tmp_path):
    registry, asked = tools(tmp_path)
    result = await registry.call("s", "ada", "filesystem.write", {"path": "a.txt", "content": "x"})
    assert result.ok, result.error
    assert asked.calls == [("filesystem.write", {"path": "a.txt", "content": "x"})]
    assert (tmp_path / "root" / "a.txt").read_text() == "x"


async def test_http_download_and_post_are_prechecked_too(tmp_path):
    registry, asked = tools(tmp_path)
    download = await registry.call(
        "s", "ada", "http.download", {"url": "https://example.com/f", "destination": "../f"}
    )
    assert download.error == {
        "code": "path_outside_root",
        "message": "path '../f' leads outside the workspace root",
        "field": "destination",
    }
    post = await registry.call("s", "ada", "http.post", {"url": "ftp://example.com/"})
    assert (post.error["code"], post.error["field"]) == ("invalid_argument", "url")
    assert asked.calls == []


class Params(msgspec.Struct):
    n: int


async def test_any_tool_may_register_a_precheck_and_block_still_comes_first():
    asked = Asked()
    checked: list[int] = []
    ran: list[int] = []

    async def precheck(call, params: Params) -> None:
        checked.append(params.n)
        if params.n < 0:
            raise InvalidArgument("n must be >= 0", field="n")

    async def handler(call, params: Params) -> dict:
        ran.append(params.n)
        return {"n": params.n}

    registry = ToolRegistry(PolicyTable({"x.blocked": "BLOCK"}), approver=asked)
    for name in ("x.approve", "x.blocked"):
        registry.register(name, Params, handler, "X.", policy=Policy.APPROVE, precheck=precheck)
    refused = await registry.call("s", "ada", "x.approve", {"n": -1})
    assert refused.error == {"code": "invalid_argument", "message": "n must be >= 0", "field": "n"}
    blocked = await registry.call("s", "ada", "x.blocked", {"n": -1})
    assert blocked.error == {"code": "blocked", "message": "x.blocked is blocked by policy"}
    assert (await registry.call("s", "ada", "x.approve", {"n": 1})).data == {"n": 1}
    assert (checked, asked.calls, ran) == ([-1, 1], [("x.approve", {"n": 1})], [1])
