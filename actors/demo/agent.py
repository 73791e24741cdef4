"""The demo agent: what ``turnstile serve`` runs when no model is configured.

It reads a few requests in English and French (``actors.demo.phrases``) and carries them out
through the same tool calls a model would make, through ``TurnContext.call_tool``: so the
stream shows ``tool_started`` / ``tool_call`` events, the calls go through the tools' policies,
and the results come back as they would to a model.

========================================  =======================================================
request                                   tool calls
========================================  =======================================================
remind me in 2 minutes to stretch         ``schedule_recall`` (``call_type`` once, ``when`` as
                                          written); a repeating time is ``schedule_cron``
every weekday at 9am say standup          ``schedule_cron`` (``cron`` as written, a
                                          notification); a single time is ``schedule_once``
watch <url> every 30 seconds ...          ``watch_start`` (``http.get``, ``on_change``)
fetch <url> in the background             ``background_run`` (``http.get``)
remember that I like dark roast           ``memory`` (``save``)
what do you remember about me             ``memory`` (``list``)
what's scheduled                          ``schedule_list``, ``manage_recall`` (``list``),
                                          ``watch_list``
cancel <id>                               ``manage_recall`` (``rc_…``), ``background_cancel``
                                          (``bg-…``), else ``schedule_cancel``, then
                                          ``watch_stop``
========================================  =======================================================

Every tool it calls is ``AUTO`` under the default policies (``http.get`` is, and so the
watcher and the background task may run it); a policy that asks for approval makes the call
wait for a person, as with a model, and a refusal is answered with the tool's own message
and where policies are set; a URL the http module's guard refuses (loopback, private
addresses) is answered with how to allow it.

What comes back by itself is answered too: a recall it scheduled (``⏰ Reminder: stretch``),
a scheduled notification (``🔔 standup``), a watcher's escalation and a background task's
end, whether it starts a turn or is folded into one, and whether it arrives as the turn's
input or as one of its system messages.

Anything else is answered as the scripted agent answers it (``You said: …``, and ``/call``,
``/think``, ``/sleep``, ``/fail``, ``/context`` work as there), followed by a line saying what
the demo understands and how to plug in a model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from turnstile.actors.demo.phrases import Lang, Request, interval_seconds, read_request
from turnstile.actors.sessions.agents import ScriptedAgent, ToolResult, TurnContext

__all__ = ["DemoAgent", "HELP", "DEFAULT_WATCH_SECONDS"]

#: A watcher's interval when the request names none.
DEFAULT_WATCH_SECONDS = 60
#: How a reminder's self-instruction starts, so that its turn can be told apart from a recall
#: a model or a ``/call`` scheduled.
_REMINDER = {"en": "Remind the user: ", "fr": "Rappeler à l'utilisateur : "}

HELP = (
    "I am Turnstile's demo agent: no model is configured, so I understand only a few "
    "requests, and carry them out with the same tools a model would use. Try: "
    "“remind me in 2 minutes to stretch”, “every weekday at 9am say standup”, "
    "“watch https://example.com every 30 seconds and tell me when it changes”, "
    "“fetch https://example.com in the background”, “remember that I like dark roast”, "
    "“what do you remember about me”, “what's scheduled”, “cancel <id>” "
    "(or in French: “rappelle-moi dans 2 minutes de m'étirer”). "
    'To talk to a model instead, set agent = "openai" and [openai] base_url and model in '
    "the config (README, “Model servers”)."
)
_HELP_FR = (
    "Je suis l'agent de démonstration de Turnstile : sans modèle configuré, je ne comprends "
    "que quelques demandes, que j'exécute avec les outils qu'un modèle utiliserait. Essayez : "
    "« rappelle-moi dans 2 minutes de m'étirer », « tous les jours de semaine à 9h dis "
    "standup », « surveille https://example.com toutes les 30 secondes », « récupère "
    "https://example.com en arrière-plan », « souviens-toi que j'aime le café noir », "
    "« que sais-tu de moi », « qu'est-ce qui est prévu », « annule <id> ». "
    'Pour un vrai modèle : agent = "openai" et [openai] base_url, model dans la configuration '
    "(README, « Model servers »)."
)

_MARKER = re.compile(
    r"^\[(RECALL|SCHEDULED NOTIFICATION|SCHEDULED TOOL CALL|SCHEDULED TOOL RESULT|CRON|"
    r"HEARTBEAT|SCHEDULED CHECK|WATCHER UPDATE|BACKGROUND TASK (?:COMPLETED|FAILED|CANCELLED))\]"
    r"(.*)$",
    re.MULTILINE,
)


class DemoAgent(ScriptedAgent):
    """The default agent without a model: see the module docstring.

    Args:
        token_delay: seconds to wait before each streamed word (0 streams at once).
    """

    name = "demo"

    async def run_turn(self, turn: TurnContext) -> str:
        """Carry out the request, answer what came back by itself, or echo with help."""
        text = turn.input.content.strip()
        if turn.input.source == "user" and (text.startswith("/") or not text):
            return await super().run_turn(turn)  # the scripted agent's commands
        notices = _notices(turn)
        if turn.input.source != "user" or notices:
            reply = "\n".join(notices) or _other(turn)
        else:
            request = read_request(text)
            if request is None:
                reply = f"You said: {text}\n{HELP}"
            else:
                reply = await self._carry_out(turn, request)
        for entry in turn.take_injections():  # what came in meanwhile
            found = _answers(entry.content, {})
            reply += "\n" + ("\n".join(found) if found else f"(also noted: {entry.content})")
        await self._stream(turn, reply)
        return reply

    async def _carry_out(self, turn: TurnContext, request: Request) -> str:
        fr = request.lang == "fr"
        match request.kind:
            case "help":
                return _HELP_FR if fr else HELP
            case "remind":
                if request.repeats:
                    return await _schedule(turn, request, request.what)
                return await _remind(turn, request)
            case "schedule":
                return await _schedule(turn, request, request.what)
            case "watch":
                return await _watch(turn, request)
            case "fetch":
                return await _fetch(turn, request)
            case "remember":
                return await _remember(turn, request)
            case "recall_memory":
                return await _recall_memory(turn, request.lang)
            case "list":
                return await _list(turn, request.lang)
            case "cancel":
                return await _cancel(turn, request)
        return HELP  # pragma: no cover - every kind is matched above


# -- requests ------------------------------------------------------------------------------------


#: Codes of a refusal by a tool policy (``[policies]``), and the hint the answer adds.
_POLICY_CODES = ("blocked", "denied", "unwatchable_tool")
_POLICY_HINT = " (a tool policy: see [policies] in the config, docs/tools.md)"
#: The http module's guard refuses loopback and private addresses unless allowed.
_ADDRESS_HINT = (
    " (loopback and private addresses are refused unless [modules.http] allowed_hosts or"
    " allowed_networks allows them, docs/tools.md)"
)


def _hint(code: str, message: str) -> str:
    if code in _POLICY_CODES:
        return _POLICY_HINT
    if code == "blocked_address" or message.startswith("refusing "):
        return _ADDRESS_HINT
    return ""


def _failed(tool: str, result: ToolResult, lang: Lang) -> str:
    error = result.error or {}
    code = str(error.get("code") or "")
    message = str(error.get("message") or code or "unknown error")
    if lang == "fr":
        return f"{tool} a échoué : {message}{_hint(code, message)}"
    return f"{tool} failed: {message}{_hint(code, message)}"


async def _remind(turn: TurnContext, request: Request) -> str:
    result = await turn.call_tool(
        "schedule_recall",
        {
            "call_type": "once",
            "when": request.when,
            "internal_comment": request.what[:200],
            "additional_context_message": _REMINDER[request.lang] + request.what,
        },
    )
    if not result.ok:
        return _failed("schedule_recall", result, request.lang)
    data = result.data or {}
    rid, understood = data.get("recall_id", "?"), data.get("understood", request.when)
    if request.lang == "fr":
        return (
            f"⏰ Rappel prévu : « {request.what} », {understood} (rappel {rid} ; "
            f"« annule {rid} » l'enlève)."
        )
    return (
        f"⏰ Reminder set: “{request.what}”, {understood} (recall {rid}; “cancel {rid}” drops it)."
    )


async def _schedule(turn: TurnContext, request: Request, message: str) -> str:
    common = {"action_type": "notification", "prompt": message, "label": message[:200]}
    if request.repeats:
        tool, arguments = "schedule_cron", {"cron": request.when, **common}
    else:
        tool, arguments = "schedule_once", {"when": request.when, **common}
    result = await turn.call_tool(tool, arguments)
    if not result.ok:
        return _failed(tool, result, request.lang)
    data = result.data or {}
    job, understood = data.get("job_id", "?"), data.get("understood", request.when)
    if request.lang == "fr":
        return f"📅 Prévu : « {message} », {understood} (tâche {job} ; « annule {job} » l'arrête)."
    return f"📅 Scheduled: “{message}”, {understood} (job {job}; “cancel {job}” stops it)."


def _checked_url(request: Request) -> str | None:
    if re.match(r"https?://\S+$", request.url):
        return None
    if request.lang == "fr":
        return f"« {request.url} » n'est pas une URL : donnez-la entière, https://… compris."
    return f"“{request.url}” is not a URL: give it whole, https://… included."


async def _watch(turn: TurnContext, request: Request) -> str:
    if (bad := _checked_url(request)) is not None:
        return bad
    seconds = interval_seconds(request.every) if request.every else DEFAULT_WATCH_SECONDS
    if seconds is None:
        if request.lang == "fr":
            return f"Je ne lis pas « {request.every} » comme un intervalle (ex. 30 secondes)."
        return f"I cannot read “{request.every}” as an interval (e.g. 30 seconds)."
    interval = int(seconds) if seconds == int(seconds) else seconds
    result = await turn.call_tool(
        "watch_start",
        {
            "tool": "http.get",
            "params": {"url": request.url},
            "interval": interval,
            "label": request.url[:200],
            "notify_when": "on_change",
        },
    )
    if not result.ok:
        return _failed("watch_start", result, request.lang)
    wid = (result.data or {}).get("watcher_id", "?")
    if request.lang == "fr":
        return (
            f"👀 Je surveille {request.url} toutes les {interval} s et vous préviens quand la "
            f"page change (observateur {wid} ; « annule {wid} » l'arrête)."
        )
    return (
        f"👀 Watching {request.url} every {interval} s; I will tell you when it changes "
        f"(watcher {wid}; “cancel {wid}” stops it)."
    )


async def _fetch(turn: TurnContext, request: Request) -> str:
    if (bad := _checked_url(request)) is not None:
        return bad
    result = await turn.call_tool(
        "background_run", {"name": "http.get", "params": {"url": request.url}}
    )
    if not result.ok:
        return _failed("background_run", result, request.lang)
    task = (result.data or {}).get("task_id", "?")
    if request.lang == "fr":
        return f"📦 Je récupère {request.url} en arrière-plan (tâche {task}) ; je vous dirai quand."
    return f"📦 Fetching {request.url} in the background (task {task}); I will say when it is done."


def _fact_key(fact: str) -> str:
    words = re.findall(r"\w+", fact.lower())
    return "_".join(words[:8])[:128] or "note"


async def _remember(turn: TurnContext, request: Request) -> str:
    fact = request.what
    result = await turn.call_tool(
        "memory",
        {
            "action": "save",
            "category": "notes",
            "key": _fact_key(fact),
            "value": fact,
            "source": "user_explicit",
        },
    )
    if not result.ok:
        return _failed("memory", result, request.lang)
    if request.lang == "fr":
        return f"🧠 C'est noté : « {fact} »."
    return f"🧠 Noted: “{fact}”."


async def _recall_memory(turn: TurnContext, lang: Lang) -> str:
    result = await turn.call_tool("memory", {"action": "list"})
    if not result.ok:
        return _failed("memory", result, lang)
    facts = [f.get("value", "") for f in (result.data or {}).get("facts", [])]
    if not facts:
        if lang == "fr":
            return "Je ne sais rien de vous pour l'instant : dites « souviens-toi que … »."
        return "I remember nothing about you yet: say “remember that …”."
    head = "Voici ce que je sais de vous :" if lang == "fr" else "What I remember about you:"
    return "\n".join([head, *(f"- {fact}" for fact in facts)])


async def _list(turn: TurnContext, lang: Lang) -> str:
    fr = lang == "fr"
    lines: list[str] = []
    jobs = await turn.call_tool("schedule_list", {"status": "active"})
    recalls = await turn.call_tool("manage_recall", {"action": "list"})
    watchers = await turn.call_tool("watch_list", {})
    for result, tool in ((jobs, "schedule_list"), (recalls, "manage_recall"), (watchers, "")):
        if not result.ok:
            lines.append(_failed(tool or "watch_list", result, lang))
    pending = (recalls.data or {}).get("pending_recall_id") if recalls.ok else None
    for recall in (recalls.data or {}).get("recalls", []) if recalls.ok else []:
        if recall.get("recall_id") == pending:
            note = recall.get("internal_comment") or recall.get("additional_context_message")
            at = re.sub(r"\.\d+(?=Z$)", "", str(recall.get("trigger_at")))  # whole seconds
            lines.append(f"- ⏰ {pending}: “{note}” — {at}")
    for job in (jobs.data or {}).get("jobs", []) if jobs.ok else []:
        if job.get("job_id") == pending or str(job.get("job_id", "")).startswith("rc_"):
            continue  # shown above, as a recall
        when = job.get("understood") or job.get("cron") or ""
        lines.append(f"- 📅 {job.get('job_id')}: “{job.get('label')}” — {when}")
    for watcher in (watchers.data or {}).get("watchers", []) if watchers.ok else []:
        if watcher.get("status") in ("stopped",):
            continue
        lines.append(
            f"- 👀 {watcher.get('watcher_id')}: {watcher.get('label')} every "
            f"{watcher.get('interval')} s ({watcher.get('status')})"
        )
    if not lines:
        return "Rien n'est prévu." if fr else "Nothing is scheduled."
    head = "Prévu :" if fr else "Scheduled:"
    tail = "« annule <id> » en enlève un." if fr else "“cancel <id>” drops one."
    return "\n".join([head, *lines, tail])


async def _cancel(turn: TurnContext, request: Request) -> str:
    target, fr = request.target, request.lang == "fr"
    done = f"Annulé : {target}." if fr else f"Cancelled {target}."
    if target.startswith("rc_"):
        listed = await turn.call_tool("manage_recall", {"action": "list"})
        if listed.ok and (listed.data or {}).get("pending_recall_id") == target:
            result = await turn.call_tool("manage_recall", {"action": "cancel"})
            return done if result.ok else _failed("manage_recall", result, request.lang)
    elif target.startswith("bg-"):
        result = await turn.call_tool("background_cancel", {"task_id": target})
        if not result.ok:
            return _failed("background_cancel", result, request.lang)
        if (result.data or {}).get("cancelled"):
            return done
        return f"{target} : déjà terminée." if fr else f"{target} had already finished."
    else:
        for tool, arguments in (
            ("schedule_cancel", {"job_id": target}),
            ("watch_stop", {"watcher_id": target}),
        ):
            result = await turn.call_tool(tool, arguments)
            if result.ok:
                return done
            if (result.error or {}).get("code") != "not_found":
                return _failed(tool, result, request.lang)
    if fr:
        return f"Rien ici ne porte l'id {target} (« qu'est-ce qui est prévu » les liste)."
    return f"Nothing here has the id {target} (“what's scheduled” lists them)."


# -- what comes back by itself -------------------------------------------------------------------


def _notices(turn: TurnContext) -> list[str]:
    """Answers to the notices in the turn's input and in its system messages."""
    texts: Iterable[str] = (turn.input.content, *turn.input.system_messages)
    payload = turn.input.payload if isinstance(turn.input.payload, dict) else {}
    found: list[str] = []
    for text in texts:
        found += _answers(text, payload)
    if turn.input.source == "recall" and not found:
        found.append(_recall(payload, ""))
    return found


def _answers(text: str, payload: dict[str, Any]) -> list[str]:
    """One line for each notice in ``text`` (several may come in one input)."""
    marks = list(_MARKER.finditer(text))
    out = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        head, body = mark.group(2).strip(), text[mark.end() : end].strip()
        out.append(_answer(mark.group(1), head, body, payload))
    return out


def _field(head: str, name: str) -> str:
    m = re.search(rf'{name}=("(?:[^"\\]|\\.)*"|[^,\s]+)', head)
    if m is None:
        return ""
    value = m.group(1)
    if value.startswith('"'):
        try:
            return str(json.loads(value))
        except ValueError:
            return value.strip('"')
    return value


def _http_summary(body: str) -> str:
    status = re.search(r'"status_code":\s*(\d+)', body)
    size = re.search(r'"bytes":\s*(\d+)', body)
    parts = [f"HTTP {status.group(1)}"] if status else []
    if size:
        parts.append(f"{size.group(1)} bytes")
    if parts:
        return ", ".join(parts)
    first = body.splitlines()[0] if body else ""
    return first[:200]


def _recall(payload: dict[str, Any], head: str) -> str:
    instruction = str(payload.get("instruction") or "")
    for lang, prefix in _REMINDER.items():
        if instruction.startswith(prefix):
            what = instruction.removeprefix(prefix)
            return f"⏰ Rappel : {what}" if lang == "fr" else f"⏰ Reminder: {what}"
    return f"⏰ Recall: {instruction or _field(head, 'note') or head}"


def _answer(kind: str, head: str, body: str, payload: dict[str, Any]) -> str:
    if kind == "RECALL":
        return _recall(payload, head)
    if kind in ("SCHEDULED NOTIFICATION", "CRON"):
        return f"🔔 {body or _field(head, 'label') or head}"
    if kind == "HEARTBEAT":
        return "💓 Heartbeat: nothing to report."
    if kind == "SCHEDULED CHECK":
        return f"🔎 Scheduled check: {body or head}"
    if kind in ("SCHEDULED TOOL CALL", "SCHEDULED TOOL RESULT"):
        return f"⚙️ Scheduled {_field(head, 'tool') or 'tool'}: {_http_summary(body) or 'done'}"
    if kind == "WATCHER UPDATE":
        label = _field(head, "label") or _field(head, "watcher_id")
        check = re.search(r"Check #(\d+)", body)
        number = int(check.group(1)) if check else 0
        error = re.search(r"^Error: (.*)$", body, re.MULTILINE)
        if error:
            reason = error.group(1)
            return f"👀 {label}: check #{number} failed: {reason}{_hint('', reason)}"
        if number == 1:
            seen = _http_summary(body)
            return f"👀 {label}: first look taken ({seen}); I will say when it changes."
        return f"👀 {label} changed (check #{number}): {_http_summary(body)}"
    task, tool = _field(head, "task_id"), _field(head, "tool")
    elapsed = _field(head, "elapsed")
    if kind == "BACKGROUND TASK COMPLETED":
        return f"📦 Task {task} ({tool}) done in {elapsed}: {_http_summary(body)}"
    if kind == "BACKGROUND TASK FAILED":
        reason = body.removeprefix("Error: ")
        return f"📦 Task {task} ({tool}) failed: {reason}{_hint('', reason)}"
    return f"📦 Task {task} ({tool}) was cancelled."


def _other(turn: TurnContext) -> str:
    """A turn that is no user message and carries no notice the demo knows (a webhook, a
    cron prompt, a check): say what came."""
    source, content = turn.input.source, turn.input.content.strip()
    if source in ("cron", "schedule") and content:
        return f"🔔 {content}"
    first = content.splitlines()[0] if content else "(empty)"
    return f"Received a {source} input: {first}"
