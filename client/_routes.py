"""``HttpRoutes``: a node's HTTP API for one token: ``request`` (any route: its JSON answer,
or the node's error as an exception by its code), and the routes of the features beside the
sessions': approvals, jobs, watchers, background tasks, recalls, heartbeats, memory
(``docs/client.md``, "REST"). Those answer with the JSON objects ``/openapi.json`` describes.
"""

from __future__ import annotations

from typing import Any, TypeVar

import httpx
import msgspec

from turnstile.client._errors import ConnectionLost, TurnstileClientError, error_for
from turnstile.client._wire import why_failed

__all__ = ["HttpRoutes"]

T = TypeVar("T")


class HttpRoutes:
    """The node's HTTP API, the base of ``Client`` (which adds the WebSocket and the sessions'
    routes). Each method raises the node's error by its code (``NotFound``, ``Conflict`` …),
    and ``ConnectionLost`` when the node cannot be reached.

    Args:
        http: the httpx client, with the node's ``base_url`` and the ``Authorization`` header.
    """

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    @property
    def url(self) -> str:
        """The node's base URL."""
        return str(self._http.base_url).rstrip("/")

    # ---- HTTP ------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Any route of the API: its JSON answer (None for an answer without a body).

        Raises:
            TurnstileClientError: the node's error answer, by its code.
            ConnectionLost: the node could not be reached.
        """
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http.request(
                method, path, params=query, json=json, headers=headers
            )
        except httpx.ConnectError as exc:
            raise ConnectionLost(
                f"cannot reach the node at {self.url}: {why_failed(exc)}"
            ) from None
        except httpx.TimeoutException:
            raise ConnectionLost(f"the node at {self.url} did not answer in time") from None
        except httpx.TransportError as exc:
            raise ConnectionLost(f"request to {self.url} failed: {exc!r}") from None
        if response.is_success:
            return response.json() if response.content else None
        raise _http_error(response)

    async def _typed(self, kind: type[T], method: str, path: str, **kwargs: Any) -> T:
        return msgspec.convert(await self.request(method, path, **kwargs), kind)

    async def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``status``, ``version``, ``protocol``."""
        answer: dict[str, Any] = await self.request("GET", "/healthz")
        return answer

    # approvals

    async def approvals(self, session_id: str) -> list[dict[str, Any]]:
        """``GET /sessions/{id}/approvals``: pending approvals (``approval_id``, ``tool``)."""
        answer = await self.request("GET", f"/sessions/{session_id}/approvals")
        return list(answer["approvals"])

    async def approve(self, approval_id: str) -> dict[str, Any]:
        """``POST /approvals/{id}/approve``: ``approval_id``, ``decision``, ``session_id``."""
        answer: dict[str, Any] = await self.request("POST", f"/approvals/{approval_id}/approve")
        return answer

    async def deny(self, approval_id: str) -> dict[str, Any]:
        """``POST /approvals/{id}/deny``."""
        answer: dict[str, Any] = await self.request("POST", f"/approvals/{approval_id}/deny")
        return answer

    # jobs

    async def jobs(
        self, *, session_id: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        """``GET /jobs``: your scheduled jobs (of one session, in one state)."""
        answer = await self.request("GET", "/jobs", params={"session": session_id, "state": state})
        return list(answer["jobs"])

    async def get_job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{id}``: ``job`` and its last 100 ``runs``."""
        answer: dict[str, Any] = await self.request("GET", f"/jobs/{job_id}")
        return answer

    async def pause_job(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/pause``: the job, paused (it fires nothing until resumed).

        Raises:
            Conflict: the job is completed or cancelled.
        """
        answer: dict[str, Any] = await self.request("POST", f"/jobs/{job_id}/pause")
        return answer

    async def resume_job(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/resume``: the job, active again from its next occurrence.

        Raises:
            Conflict: the job is completed or cancelled.
        """
        answer: dict[str, Any] = await self.request("POST", f"/jobs/{job_id}/resume")
        return answer

    async def cancel_job(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/cancel``: the job, cancelled."""
        answer: dict[str, Any] = await self.request("POST", f"/jobs/{job_id}/cancel")
        return answer

    # watchers

    async def create_watcher(self, session_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        """``POST /sessions/{id}/watchers`` with a ``watch_start`` spec: the watcher."""
        answer: dict[str, Any] = await self.request(
            "POST", f"/sessions/{session_id}/watchers", json=spec
        )
        return answer

    async def watchers(self, session_id: str | None = None) -> dict[str, Any]:
        """``GET /watchers`` (or one session's): ``watchers``, ``total``, ``running``,
        ``paused``."""
        path = "/watchers" if session_id is None else f"/sessions/{session_id}/watchers"
        answer: dict[str, Any] = await self.request("GET", path)
        return answer

    async def get_watcher(self, watcher_id: str) -> dict[str, Any]:
        """``GET /watchers/{id}``: its status and recent checks."""
        answer: dict[str, Any] = await self.request("GET", f"/watchers/{watcher_id}")
        return answer

    async def stop_watcher(self, watcher_id: str) -> dict[str, Any]:
        """``DELETE /watchers/{id}``: the watcher, stopped and forgotten (``status``
        ``stopped``)."""
        answer: dict[str, Any] = await self.request("DELETE", f"/watchers/{watcher_id}")
        return answer

    async def pause_watcher(self, watcher_id: str) -> dict[str, Any]:
        """``POST /watchers/{id}/pause``: the watcher."""
        answer: dict[str, Any] = await self.request("POST", f"/watchers/{watcher_id}/pause")
        return answer

    async def resume_watcher(self, watcher_id: str) -> dict[str, Any]:
        """``POST /watchers/{id}/resume``: the watcher."""
        answer: dict[str, Any] = await self.request("POST", f"/watchers/{watcher_id}/resume")
        return answer

    # background tasks, recalls, heartbeats

    async def tasks(self, session_id: str) -> dict[str, Any]:
        """``GET /sessions/{id}/tasks``: the session's background tasks."""
        answer: dict[str, Any] = await self.request("GET", f"/sessions/{session_id}/tasks")
        return answer

    async def get_task(self, session_id: str, task_id: str) -> dict[str, Any]:
        """``GET /sessions/{id}/tasks/{task_id}``: a background task's status."""
        answer: dict[str, Any] = await self.request(
            "GET", f"/sessions/{session_id}/tasks/{task_id}"
        )
        return answer

    async def cancel_task(self, session_id: str, task_id: str) -> dict[str, Any]:
        """``POST /sessions/{id}/tasks/{task_id}/cancel``."""
        answer: dict[str, Any] = await self.request(
            "POST", f"/sessions/{session_id}/tasks/{task_id}/cancel"
        )
        return answer

    async def recall(self, session_id: str) -> dict[str, Any] | None:
        """``GET /sessions/{id}/recall``: the pending recall, or None."""
        answer = await self.request("GET", f"/sessions/{session_id}/recall")
        recall: dict[str, Any] | None = answer["recall"]
        return recall

    async def cancel_recall(self, session_id: str) -> dict[str, Any]:
        """``DELETE /sessions/{id}/recall``: the cancelled recall.

        Raises:
            NotFound: none is pending.
        """
        answer: dict[str, Any] = await self.request("DELETE", f"/sessions/{session_id}/recall")
        return answer

    async def heartbeat(self, session_id: str) -> dict[str, Any]:
        """``GET /sessions/{id}/heartbeat``: its settings and latest runs."""
        answer: dict[str, Any] = await self.request("GET", f"/sessions/{session_id}/heartbeat")
        return answer

    # memory

    async def facts(
        self,
        *,
        search: str | None = None,
        category: str | None = None,
        sort_by: str | None = None,
        sort_order: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        all_users: bool = False,
    ) -> dict[str, Any]:
        """``GET /memory/facts``: a page of your long-term memory's facts (``docs/memory.md``):
        ``facts``, ``total``, ``offset``. None leaves a parameter to the node.

        Args:
            search: only facts whose category, key or value holds this.
            category: only this category.
            sort_by: ``category``, ``key``, ``value``, ``source``, ``confidence``,
                ``created_at`` or ``updated_at``.
            sort_order: ``asc`` or ``desc``.
            limit: facts in the page.
            offset: facts skipped (the next page's start).
            all_users: every user's facts, each with its ``owner``.

        Raises:
            Forbidden: ``all_users`` without the ``memory.read_all`` permission.
        """
        params = {
            "search": search,
            "category": category,
            "sort_by": sort_by,
            "sort_order": sort_order,
            "limit": limit,
            "offset": offset,
            "all_users": all_users or None,
        }
        answer: dict[str, Any] = await self.request("GET", "/memory/facts", params=params)
        return answer

    async def search_memory(self, query: str, *, limit: int | None = None) -> dict[str, Any]:
        """``GET /memory/search``: the facts that match ``query``, best first."""
        answer: dict[str, Any] = await self.request(
            "GET", "/memory/search", params={"query": query, "limit": limit}
        )
        return answer

    async def put_fact(self, category: str, key: str, value: str, **fields: Any) -> dict[str, Any]:
        """``PUT /memory/facts``: save a fact (``source``, ``confidence``, ``expires_days``
        in ``fields``)."""
        body = {"category": category, "key": key, "value": value, **fields}
        answer: dict[str, Any] = await self.request("PUT", "/memory/facts", json=body)
        return answer

    async def forget_fact(self, key: str, *, category: str | None = None) -> dict[str, Any]:
        """``DELETE /memory/facts``: forget the fact(s) under ``key``."""
        answer: dict[str, Any] = await self.request(
            "DELETE", "/memory/facts", params={"key": key, "category": category}
        )
        return answer

    async def memory_summary(self) -> dict[str, Any]:
        """``GET /memory/summary``."""
        answer: dict[str, Any] = await self.request("GET", "/memory/summary")
        return answer

    async def put_memory_summary(self, content: str) -> dict[str, Any]:
        """``PUT /memory/summary``."""
        answer: dict[str, Any] = await self.request(
            "PUT", "/memory/summary", json={"content": content}
        )
        return answer

    async def memory_extraction(
        self,
        *,
        due: bool = False,
        limit: int | None = None,
        after: str | None = None,
        all_users: bool = False,
    ) -> dict[str, Any]:
        """``GET /memory/extraction``: whether extraction runs (``extraction``) and a page of
        your sessions' extraction state (``sessions``; ``next_after``, the next page's
        ``after``, or None).

        Args:
            due: only the sessions due for extraction.
            limit: sessions in the page.
            after: the page after this session (with ``all_users``, its ``owner/name``).
            all_users: every user's sessions, each with its ``owner``.

        Raises:
            Forbidden: ``all_users`` without the ``memory.read_all`` permission.
        """
        params = {
            "due": due or None,
            "limit": limit,
            "after": after,
            "all_users": all_users or None,
        }
        answer: dict[str, Any] = await self.request("GET", "/memory/extraction", params=params)
        return answer

    async def memory_changes(
        self, *, after_seq: int = 0, limit: int | None = None
    ) -> dict[str, Any]:
        """``GET /memory/changes``: a page of the ``memory`` topic's events after
        ``after_seq``, oldest first (``changes``: frames ``decode_topic_event`` reads;
        ``last_seq``, ``pruned_seq``; ``reset`` and no changes when the log no longer holds
        them all)."""
        answer: dict[str, Any] = await self.request(
            "GET", "/memory/changes", params={"after_seq": after_seq, "limit": limit}
        )
        return answer

    async def delete_memory(self) -> dict[str, Any] | None:
        """``DELETE /memory``: forget everything your memory holds."""
        answer: dict[str, Any] | None = await self.request("DELETE", "/memory")
        return answer


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _http_error(response: httpx.Response) -> TurnstileClientError:
    """The exception for an error answer (``{"error": {code, message, field}}``)."""
    try:
        body = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error.get("message", ""))
        field = error.get("field")
    except (ValueError, KeyError, TypeError):
        code = "not_found" if response.status_code == 404 else f"http_{response.status_code}"
        body, message, field = {}, response.text.strip()[:200] or response.reason_phrase, None
    details = {k: v for k, v in body.items() if k != "error"} if isinstance(body, dict) else {}
    return error_for(code, message, field=field, status=response.status_code, details=details)
