// A session: its live stream as a person reads it, and what they can do to it.
//
// The transcript is built from the session's events only (docs/protocol.md), replayed and then
// live over the tab's WebSocket: on opening, the view attaches with after_seq a window before
// the session's last_seq, so the recent turns are replayed and the running one, if any, goes on
// live with no gap. Every event has a gap-free seq; the view remembers the last one it drew,
// ignores any seq it has drawn (no duplicate after a reconnect or a replay that overlaps) and
// re-attaches from it if one is ever missing. Each turn is one article: its input, the thinking
// (collapsed), the tool calls with their arguments and results, the streamed text token by
// token, and its closure (completed, empty, failed, stopped, interrupted).

import { ApiError, api, seg } from "./api.js";
import { add, confirmDialog, countdown, describe, h, pill, pretty, randomId, replace, time, when } from "./dom.js";

/** How many events before the last one a freshly opened view replays. */
const WINDOW = 2000;
const CLOSED = { completed: "Completed", empty: "No answer", failed: "Failed", stopped: "Stopped", interrupted: "Interrupted" };

export async function mount(root, { link, arg: sessionId }) {
  let session;
  try {
    session = await api("GET", `/sessions/${seg(sessionId)}`);
  } catch (exc) {
    add(root, 
      h("h1", {}, `Session ${sessionId}`),
      h("p", { class: "error", role: "alert" }, exc instanceof ApiError && exc.status === 404 ? "There is no session of yours with that name." : describe(exc)),
      h("p", {}, h("a", { href: "#/sessions" }, "Back to the sessions")),
    );
    return null;
  }

  const first = Math.max(0, session.last_seq - WINDOW);
  let lastSeq = first; // the last event drawn
  let busy = false;
  let queued = 0;
  let deleted = false;
  const turns = new Map(); // input_id -> Turn
  const sends = new Map(); // client_msg_id -> content, until acknowledged
  const approvals = new Map(); // approval_id -> card element
  const resolved = new Set(); // approval ids seen resolved (a slower GET must not bring one back)

  // ---- layout ----
  const statusText = h("span", { class: "session-status", "data-status": "idle" }, "Idle");
  const stopButton = h("button", { type: "button", class: "danger", disabled: true, onclick: stop }, "Stop");
  const policy = h(
    "select",
    { id: "policy", onchange: () => link.send({ type: "set_policy", session_id: sessionId, policy: policy.value }) },
    ["enqueue", "reject", "interrupt", "inject"].map((p) => h("option", { value: p }, p)),
  );
  policy.value = session.policy;
  const recallBox = h("section", { class: "recall", "aria-labelledby": "recall-title", hidden: true });
  const approvalBox = h("section", { class: "approvals", "aria-label": "Tool calls waiting for you", hidden: true });
  const transcript = h("div", { class: "transcript", role: "log", "aria-label": "Transcript", "aria-live": "off" });
  const announcer = h("p", { class: "visually-hidden", role: "status", "aria-live": "polite" });
  const gone = h("p", { class: "error", role: "alert", hidden: true });
  const message = h("textarea", {
    id: "message",
    name: "content",
    rows: 2,
    required: true,
    "aria-describedby": "message-hint",
    onkeydown: (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        composer.requestSubmit();
      }
    },
  });
  const sendButton = h("button", { type: "submit" }, "Send");
  const composer = h(
    "form",
    { class: "composer", onsubmit: send },
    h("label", { for: "message" }, "Message"),
    message,
    h("p", { class: "hint", id: "message-hint" }, "Enter sends, Shift+Enter starts a new line."),
    h("p", { class: "actions" }, sendButton, stopButton),
  );
  const older = first > 0 ? h("p", { class: "hint" }, `Earlier events (before #${first + 1}) are not shown.`) : null;

  add(root, 
    h(
      "div",
      { class: "session-head" },
      h("h1", {}, sessionId),
      h(
        "p",
        { class: "session-meta" },
        statusText,
        h("label", { for: "policy" }, "Mid-turn messages: "),
        policy,
        h("a", { href: `#/automations/${seg(sessionId)}` }, "Automations"),
      ),
    ),
    gone,
    recallBox,
    approvalBox,
    older,
    transcript,
    announcer,
    composer,
  );

  // ---- the stream ----
  const stopWatching = link.watch(sessionId, {
    lastSeq: () => lastSeq,
    frame: onFrame,
  });

  function onFrame(frame) {
    if ("seq" in frame && "ts" in frame) {
      if (frame.seq <= lastSeq) return; // drawn already
      if (frame.seq !== lastSeq + 1) {
        link.attach(sessionId); // one is missing: replay from what we have
        return;
      }
      lastSeq = frame.seq;
      onEvent(frame);
      return;
    }
    switch (frame.type) {
      case "session_sync": // the attach-time state
        setBusy(frame.busy, frame.queued);
        policy.value = frame.policy;
        resend();
        break;
      case "ack":
        if (frame.client_msg_id) {
          const content = sends.get(frame.client_msg_id);
          sends.delete(frame.client_msg_id);
          if (content !== undefined && frame.input_id) turn(frame.input_id).setInput("user", content);
        }
        break;
      case "policy":
        policy.value = frame.policy;
        break;
      case "session_deleted":
        deleted = true;
        gone.textContent = "This session was deleted.";
        gone.hidden = false;
        for (const el of composer.elements) el.disabled = true;
        break;
      case "error":
        if (frame.field === "client_msg_id" || frame.code === "busy" || frame.code === "limit_exceeded") {
          sends.clear();
        }
        showError(describe(frame));
        break;
      default:
        break;
    }
  }

  function onEvent(event) {
    switch (event.type) {
      case "turn_queued":
        turn(event.input_id).queued(event.source, event.ahead);
        setBusy(busy, queued + 1);
        break;
      case "stream_start":
        turn(event.input_id).start(event);
        setBusy(true, queued - 1);
        break;
      case "thinking_delta":
        turn(event.input_id).think(event.text);
        break;
      case "stream_delta":
        turn(event.input_id).say(event.text);
        break;
      case "tool_started":
        turn(event.input_id).toolStarted(event);
        break;
      case "tool_call":
        turn(event.input_id).toolDone(event);
        break;
      case "user_message":
        if (event.injected_into) turn(event.injected_into).note(`Folded in (${event.source}): ${event.content}`);
        else line(`${event.source}: ${event.content}`, event);
        break;
      case "stream_end":
        turn(event.input_id).end(event);
        announcer.textContent = `Turn ${CLOSED[event.status] ? CLOSED[event.status].toLowerCase() : event.status}.`;
        setBusy(false, queued);
        break;
      case "approval_required":
        addApproval(event);
        break;
      case "approval_resolved":
        resolveApproval(event);
        break;
      case "recall_update":
        line(`Recall ${event.action}${event.trigger_at && event.action !== "fired" ? `, next ${when(event.trigger_at)}` : ""}`, event);
        loadRecall();
        break;
      case "job_update":
        line(`Job ${event.label || event.kind} ${event.event}${event.next_fire_at ? `, next ${when(event.next_fire_at)}` : ""}`, event);
        break;
      case "watcher_update":
        line(`Watcher ${event.label || event.tool_name} ${event.what}`, event);
        break;
      case "notification":
        notification(event);
        break;
      case "notifications_dropped":
        line(event.message, event);
        break;
      case "heartbeat_suppressed":
        line(`A quiet heartbeat ran (${event.chars} characters, not forwarded)`, event);
        break;
      case "heartbeat_disabled":
        line(`Heartbeat disabled: ${event.error}`, event);
        break;
      case "source_binding":
        line(`${event.action === "bound" ? "Bound to" : "Unbound from"} ${event.source} (${event.via})`, event);
        break;
      case "session_sync":
        line(`A turn ran with nobody watching: ${event.status}`, event);
        break;
      default:
        line(event.type, event);
    }
  }

  function setBusy(nowBusy, nowQueued) {
    busy = nowBusy;
    queued = Math.max(0, nowQueued || 0);
    const word = busy ? "Running a turn" : queued ? "Queued" : "Idle";
    statusText.textContent = queued ? `${word} · ${queued} queued` : word;
    statusText.dataset.status = busy ? "running" : queued ? "queued" : "idle";
    stopButton.disabled = !busy || deleted;
  }

  // ---- turns ----
  function turn(inputId) {
    let found = turns.get(inputId);
    if (!found) {
      found = new Turn(inputId);
      turns.set(inputId, found);
      place(found.el);
    }
    return found;
  }

  function place(el) {
    const follow = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 80;
    transcript.append(el);
    if (follow) transcript.scrollTop = transcript.scrollHeight;
  }

  function line(text, event) {
    place(h("p", { class: "event-line", "data-type": event.type, "data-seq": event.seq }, time(event.ts, new Date(event.ts).toLocaleTimeString()), " ", text));
  }

  function notification(event) {
    place(
      h(
        "aside",
        { class: "notification", "data-seq": event.seq, "aria-label": "Notification" },
        h("strong", {}, event.title || "Notification"),
        event.buffered ? pill("buffered") : null,
        event.priority && event.priority !== "normal" ? pill(event.priority) : null,
        h("p", {}, event.message),
        h("p", { class: "hint" }, `${event.source || ""} · ${when(event.created_at || event.ts)}`),
      ),
    );
  }

  class Turn {
    constructor(inputId) {
      this.inputId = inputId;
      this.input = h("p", { class: "turn-input" });
      this.state = h("span", { class: "turn-state" });
      this.body = h("div", { class: "turn-body" });
      this.text = null;
      this.thinking = null;
      this.tools = new Map();
      this.closure = h("p", { class: "turn-closure", hidden: true });
      this.el = h(
        "article",
        { class: "turn", "data-input": inputId, "aria-label": `Turn ${inputId}` },
        h("header", {}, this.input, this.state),
        this.body,
        this.closure,
      );
      this.started = false;
    }

    setInput(source, content, extra = null) {
      replace(this.input, source !== "user" ? pill(source) : null, h("span", { class: "content" }, content), extra);
    }

    queued(source, ahead) {
      if (this.started) return;
      this.state.replaceChildren(pill(ahead ? `queued, ${ahead} ahead` : "queued", "queued"));
      if (!this.input.textContent) this.setInput(source, "");
    }

    start(event) {
      this.started = true;
      let extra = null;
      if (event.is_recall) extra = h("span", { class: "hint" }, ` — recall: ${event.instruction || ""}`);
      else if (event.label) extra = h("span", { class: "hint" }, ` — ${event.label}`);
      if (event.rerun) extra = h("span", { class: "hint" }, ` — run again after a crash (${event.rerun})`);
      this.setInput(event.source, event.content, extra);
      this.state.replaceChildren(pill("running"));
    }

    think(text) {
      if (!this.thinking) {
        this.thinkingText = h("div", { class: "thinking-text" });
        this.thinking = h("details", { class: "thinking" }, h("summary", {}, "Thinking"), this.thinkingText);
        this.body.append(this.thinking);
      }
      this.thinkingText.append(text);
    }

    say(text) {
      if (!this.text) {
        this.text = h("div", { class: "turn-text" });
        this.body.append(this.text);
      }
      this.text.append(text); // a text node per token: nothing re-parsed, nothing re-laid out above
      const follow = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 120;
      if (follow) transcript.scrollTop = transcript.scrollHeight;
    }

    note(text) {
      this.body.append(h("p", { class: "turn-note" }, text));
    }

    toolStarted(event) {
      const key = event.call_id || `${event.tool}#${this.tools.size}`;
      const status = pill("running");
      const result = h("div", { class: "tool-result" });
      const el = h(
        "details",
        { class: "tool", "data-tool": event.tool },
        h("summary", {}, h("code", {}, event.tool), " ", status),
        h("p", { class: "label" }, "Arguments"),
        h("pre", {}, pretty(event.arguments)),
        result,
      );
      this.tools.set(key, { el, status, result, done: false, tool: event.tool });
      this.body.append(el);
      this.text = null; // text after a tool call starts a new paragraph
    }

    toolDone(event) {
      let entry = event.call_id ? this.tools.get(event.call_id) : null;
      if (!entry) entry = [...this.tools.values()].find((t) => !t.done && t.tool === event.tool);
      if (!entry) {
        this.toolStarted(event);
        entry = [...this.tools.values()].at(-1);
      }
      entry.done = true;
      entry.status.replaceWith((entry.status = pill(event.ok ? "ok" : "failed", event.ok ? "completed" : "failed")));
      replace(entry.result, h("p", { class: "label" }, event.ok ? "Result" : "Error"), h("pre", {}, pretty(event.ok ? event.result : event.error)));
    }

    end(event) {
      this.started = true;
      if (!this.text && event.text) this.say(event.text); // the deltas were before our window
      this.state.replaceChildren(pill(CLOSED[event.status] || event.status, event.status));
      const parts = [h("strong", {}, CLOSED[event.status] || event.status)];
      if (event.error) parts.push(": ", event.error);
      if (event.usage) parts.push(h("span", { class: "hint" }, ` · ${event.usage.total_tokens} tokens`));
      replace(this.closure, parts);
      this.closure.hidden = false;
      this.el.dataset.status = event.status;
    }
  }

  // ---- sending ----
  function send(event) {
    event.preventDefault();
    const content = message.value;
    if (!content.trim() || deleted) return;
    const id = randomId();
    sends.set(id, content);
    message.value = "";
    if (!link.send({ type: "send", session_id: sessionId, content, client_msg_id: id })) {
      showError("Not connected: the message is sent when the connection is back.");
    }
    message.focus();
  }

  // Messages not acknowledged before a drop go again with the same client_msg_id: the node
  // answers a resend with the first ack and starts no second turn.
  function resend() {
    for (const [id, content] of sends) link.send({ type: "send", session_id: sessionId, content, client_msg_id: id });
  }

  function stop() {
    link.send({ type: "stop", session_id: sessionId });
  }

  function showError(text) {
    gone.textContent = text;
    gone.hidden = false;
    clearTimeout(showError.timer);
    showError.timer = setTimeout(() => {
      if (!deleted) gone.hidden = true;
    }, 8000);
  }

  // ---- approvals ----
  function addApproval(event) {
    if (approvals.has(event.approval_id) || resolved.has(event.approval_id)) return;
    const decide = (approved) => async () => {
      for (const b of card.querySelectorAll("button")) b.disabled = true;
      try {
        await api("POST", `/approvals/${seg(event.approval_id)}/${approved ? "approve" : "deny"}`);
      } catch (exc) {
        for (const b of card.querySelectorAll("button")) b.disabled = false;
        showError(`Could not decide: ${describe(exc)}`);
      }
    };
    const card = h(
      "article",
      { class: "approval", "data-approval": event.approval_id, "aria-label": `Approval for ${event.tool}` },
      h("p", {}, h("code", {}, event.tool), event.arguments ? " wants to run with:" : " wants to run."),
      event.arguments ? h("pre", {}, pretty(event.arguments)) : null,
      event.expires_at ? h("p", { class: "hint" }, "Until ", time(event.expires_at)) : null,
      h(
        "p",
        { class: "actions" },
        h("button", { type: "button", onclick: decide(true) }, "Approve"),
        h("button", { type: "button", class: "danger", onclick: decide(false) }, "Deny"),
      ),
    );
    approvals.set(event.approval_id, card);
    approvalBox.append(card);
    approvalBox.hidden = false;
  }

  function resolveApproval(event) {
    resolved.add(event.approval_id);
    const card = approvals.get(event.approval_id);
    if (card) card.remove();
    approvals.delete(event.approval_id);
    approvalBox.hidden = approvals.size === 0;
    line(`Approval ${event.decision}${event.by ? ` by ${event.by}` : ""}`, event);
  }

  async function loadApprovals() {
    try {
      const pending = (await api("GET", `/sessions/${seg(sessionId)}/approvals`)).approvals;
      for (const a of pending) addApproval(a);
    } catch {
      // no execution feature on this node: nothing waits
    }
  }

  // ---- the recall banner ----
  let recall = null;
  let ticker = null;

  let asked = 0;

  async function loadRecall() {
    const mine = ++asked;
    let found;
    try {
      found = (await api("GET", `/sessions/${seg(sessionId)}/recall`)).recall;
    } catch {
      found = null; // no scheduling on this node
    }
    if (mine !== asked) return; // a later read is on its way: it wins
    recall = found;
    drawRecall();
  }

  function drawRecall() {
    clearInterval(ticker);
    if (!recall || recall.status !== "pending" || !recall.trigger_at) {
      recallBox.hidden = true;
      recallBox.replaceChildren();
      return;
    }
    const clock = h("time", { class: "countdown", datetime: recall.trigger_at, title: when(recall.trigger_at) });
    const tick = () => {
      const left = new Date(recall.trigger_at).getTime() - Date.now();
      clock.textContent = left > 0 ? countdown(recall.trigger_at) : "now";
    };
    tick();
    ticker = setInterval(tick, 1000);
    const act = (what) => async () => {
      if (what === "cancel") {
        const sure = await confirmDialog({ title: "Cancel the recall?", body: recall.additional_context_message, confirm: "Cancel the recall" });
        if (!sure) return;
      }
      try {
        await api(what === "cancel" ? "DELETE" : "POST", `/sessions/${seg(sessionId)}/recall${what === "skip" ? "/skip" : ""}`);
      } catch (exc) {
        showError(describe(exc));
      }
      loadRecall();
    };
    replace(
      recallBox,
      h("h2", { id: "recall-title" }, h("span", { class: "icon icon-clock", "aria-hidden": "true" }), " Recall in ", clock),
      h("p", { class: "recall-what" }, recall.additional_context_message),
      recall.call_type === "recurring" ? h("p", { class: "hint" }, `Every ${recall.interval_seconds} s · fired ${recall.fired_count} times`) : null,
      h(
        "p",
        { class: "actions" },
        recall.call_type === "recurring" ? h("button", { type: "button", onclick: act("skip") }, "Skip the next one") : null,
        h("button", { type: "button", class: "danger", onclick: act("cancel") }, "Cancel recall"),
      ),
    );
    recallBox.hidden = false;
  }

  loadRecall();
  loadApprovals();

  return () => {
    stopWatching();
    clearInterval(ticker);
    clearTimeout(showError.timer);
  };
}
