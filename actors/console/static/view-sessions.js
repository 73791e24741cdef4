// Sessions: the list (status, last activity, pending-recall badge and filter), create, delete
// (with the blocked-by-automations answer shown and confirmed). GET/POST/DELETE /sessions.

import { ApiError, api, seg } from "./api.js";
import { add, ago, confirmDialog, countdown, describe, h, pill, replace, time, when } from "./dom.js";

const REFRESH_MS = 5000;

export async function mount(root, { navigate }) {
  let filter = "all";
  let sessions = [];
  const tbody = h("tbody");
  const empty = h("p", { class: "empty", hidden: true });
  const counts = h("span", { class: "count" });
  const error = h("p", { class: "error", role: "alert" });

  const nameInput = h("input", {
    id: "new-session",
    name: "id",
    pattern: "[A-Za-z0-9_.:\\-]{1,128}",
    maxlength: 128,
    autocomplete: "off",
    "aria-describedby": "new-session-hint",
  });
  const createForm = h(
    "form",
    { class: "inline-form", onsubmit: create },
    h("label", { for: "new-session" }, "New session"),
    nameInput,
    h("button", { type: "submit" }, "Create session"),
    h(
      "p",
      { class: "hint", id: "new-session-hint" },
      "A name of letters, digits and _ . : - (leave it empty for a generated one).",
    ),
  );

  const radios = ["all", "recall"].map((value) =>
    h(
      "label",
      { class: "radio" },
      h("input", {
        type: "radio",
        name: "filter",
        value,
        checked: value === filter,
        onchange: () => {
          filter = value;
          load();
        },
      }),
      value === "all" ? "All" : "With a pending recall",
    ),
  );

  add(root, 
    h("h1", {}, "Sessions"),
    createForm,
    h("fieldset", { class: "filter" }, h("legend", {}, "Show"), radios, counts),
    error,
    h(
      "table",
      { class: "list sessions" },
      h("caption", { class: "visually-hidden" }, "Your sessions"),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", { scope: "col" }, "Session"),
          h("th", { scope: "col" }, "Status"),
          h("th", { scope: "col" }, "Last activity"),
          h("th", { scope: "col" }, "Recall"),
          h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")),
        ),
      ),
      tbody,
    ),
    empty,
  );

  let shown = "";

  async function load() {
    try {
      const query = filter === "recall" ? { has_recall: "true", limit: 1000 } : { limit: 1000 };
      sessions = (await api("GET", "/sessions", { query })).sessions;
      error.textContent = "";
    } catch (exc) {
      error.textContent = `Could not list sessions: ${describe(exc)}`;
      return;
    }
    render();
  }

  function render() {
    const now = Date.now();
    // Redraw only what changed, and give focus back to the same control of the same row, so a
    // refresh never pulls the keyboard away from the person.
    const drawn = JSON.stringify([filter, sessions]) + Math.floor(now / 1000);
    if (drawn === shown) return;
    shown = drawn;
    const focused = document.activeElement;
    const focusedRow = tbody.contains(focused) ? focused.closest("tr").dataset.session : null;
    const focusedLabel = focusedRow ? focused.getAttribute("aria-label") || focused.textContent : null;
    replace(tbody, sessions.map((s) => row(s, now)));
    if (focusedRow) {
      const again = [...tbody.querySelectorAll("a, button")].find(
        (el) => el.closest("tr").dataset.session === focusedRow && (el.getAttribute("aria-label") || el.textContent) === focusedLabel,
      );
      if (again) again.focus();
    }
    const withRecall = sessions.filter((s) => s.has_recall).length;
    counts.textContent =
      filter === "all" ? `${sessions.length} sessions, ${withRecall} with a pending recall` : `${sessions.length} with a pending recall`;
    empty.hidden = sessions.length > 0;
    empty.textContent = filter === "all" ? "No sessions yet: create one above." : "No session has a pending recall.";
  }

  function row(session, now) {
    const status =
      session.status === "queued" || (session.status === "running" && session.queued)
        ? `${session.status} (${session.queued} queued)`
        : session.status;
    const recall = session.has_recall
      ? h(
          "span",
          { class: "badge recall-badge", title: `Recall at ${when(session.recall_trigger_at)}` },
          h("span", { class: "icon icon-clock", "aria-hidden": "true" }),
          " ",
          h("span", { class: "visually-hidden" }, "Recall pending, fires in "),
          session.recall_trigger_at ? countdown(session.recall_trigger_at, now) : "due",
        )
      : "";
    return h(
      "tr",
      { "data-session": session.id },
      h("td", { "data-label": "Session" }, h("a", { href: `#/sessions/${seg(session.id)}` }, session.id)),
      h("td", { "data-label": "Status" }, pill(status || "idle", session.status || "idle")),
      h("td", { "data-label": "Last activity" }, time(session.updated_at, ago(session.updated_at, now))),
      h("td", { "data-label": "Recall" }, recall),
      h(
        "td",
        { class: "actions" },
        h("a", { href: `#/automations/${seg(session.id)}`, class: "button-link" }, "Automations"),
        h(
          "button",
          { type: "button", class: "danger", "aria-label": `Delete session ${session.id}`, onclick: () => remove(session.id) },
          "Delete",
        ),
      ),
    );
  }

  async function create(event) {
    event.preventDefault();
    const id = nameInput.value.trim();
    try {
      const created = await api("POST", "/sessions", { body: id ? { id } : {} });
      navigate(`#/sessions/${seg(created.id)}`);
    } catch (exc) {
      error.textContent = `Could not create the session: ${describe(exc)}`;
      nameInput.focus();
    }
  }

  async function remove(id) {
    const sure = await confirmDialog({
      title: `Delete session ${id}?`,
      body: "Its history, queued messages, recalls, heartbeat, watchers, background tasks and buffered notifications are deleted with it.",
      confirm: "Delete",
    });
    if (!sure) return;
    try {
      await api("DELETE", `/sessions/${seg(id)}`);
    } catch (exc) {
      if (!(exc instanceof ApiError && exc.body && exc.body.blocked_by_automations)) {
        error.textContent = `Could not delete ${id}: ${describe(exc)}`;
        return;
      }
      const jobs = exc.body.automations || [];
      const listed = h(
        "div",
        {},
        h("p", {}, `${id} has ${jobs.length} scheduled job${jobs.length === 1 ? "" : "s"} you created:`),
        h(
          "ul",
          { class: "automations" },
          jobs.map((job) =>
            h("li", {}, h("strong", {}, job.name || job.id), ` — ${job.kind}, ${job.schedule}`, job.next_run_at ? `, next ${when(job.next_run_at)}` : ""),
          ),
        ),
        h("p", {}, "Deleting the session cancels them too."),
      );
      const really = await confirmDialog({
        title: `${id} has scheduled jobs`,
        body: listed,
        confirm: `Delete with its ${jobs.length} job${jobs.length === 1 ? "" : "s"}`,
      });
      if (!really) return;
      try {
        await api("DELETE", `/sessions/${seg(id)}`, { query: { confirm: "true" } });
      } catch (again) {
        error.textContent = `Could not delete ${id}: ${describe(again)}`;
        return;
      }
    }
    await load();
  }

  await load();
  const timer = setInterval(() => {
    if (!document.querySelector("dialog[open]")) load();
  }, REFRESH_MS);
  const tick = setInterval(() => {
    if (sessions.some((s) => s.has_recall)) render(); // the recall badges count down
  }, 1000);
  return () => {
    clearInterval(timer);
    clearInterval(tick);
  };
}
