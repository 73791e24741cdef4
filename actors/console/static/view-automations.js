// Automations of one session: scheduled jobs with their run records (pause/resume), watchers (state, last
// result, history, pause/resume/stop), the heartbeat (settings, enable/disable, runs),
// background tasks and the notifications buffered for the next client.

import { ApiError, api, seg } from "./api.js";
import { add, confirmDialog, describe, h, pill, pretty, replace, time, when } from "./dom.js";

const REFRESH_MS = 5000;

export async function mount(root, { link, arg, navigate }) {
  let names;
  try {
    names = (await api("GET", "/sessions", { query: { limit: 1000 } })).sessions.map((s) => s.id);
  } catch (exc) {
    add(root, h("h1", {}, "Automations"), h("p", { class: "error", role: "alert" }, describe(exc)));
    return null;
  }
  const sessionId = arg || names[0];
  if (!sessionId) {
    add(root, h("h1", {}, "Automations"), h("p", { class: "empty" }, "No sessions yet."), h("a", { href: "#/sessions" }, "Create one"));
    return null;
  }
  if (!names.includes(sessionId)) names.unshift(sessionId);
  const base = `/sessions/${seg(sessionId)}`;
  const picker = h(
    "select",
    { id: "automation-session", onchange: () => navigate(`#/automations/${seg(picker.value)}`) },
    names.map((n) => h("option", { value: n }, n)),
  );
  picker.value = sessionId;
  const error = h("p", { class: "error", role: "alert" });

  const sections = {
    jobs: section("jobs", "Scheduled jobs"),
    watchers: section("watchers", "Watchers"),
    heartbeat: section("heartbeat", "Heartbeat"),
    tasks: section("tasks", "Background tasks"),
    notifications: section("notifications", "Buffered notifications"),
  };
  add(root, 
    h("h1", {}, "Automations"),
    h(
      "p",
      { class: "inline-form" },
      h("label", { for: "automation-session" }, "Session"),
      picker,
      h("a", { href: `#/sessions/${seg(sessionId)}` }, "Open the session"),
    ),
    error,
    Object.values(sections).map((s) => s.el),
  );

  function section(key, title) {
    const body = h("div", { class: "section-body" });
    const el = h("section", { class: `automation ${key}`, "aria-labelledby": `h-${key}` }, h("h2", { id: `h-${key}` }, title), body);
    return { el, body };
  }

  async function get(path, fallback = null) {
    try {
      return await api("GET", path);
    } catch (exc) {
      if (exc instanceof ApiError && exc.status === 404 && exc.code === "not_found" && /no route/.test(exc.message)) {
        return fallback; // that feature is not on this node
      }
      throw exc;
    }
  }

  async function act(label, fn) {
    try {
      await fn();
      error.textContent = "";
    } catch (exc) {
      error.textContent = `${label}: ${describe(exc)}`;
    }
    await load();
  }

  // ---- jobs ----
  const openRuns = new Set();

  function schedule(job) {
    const spec = job.spec || {};
    if (spec.understood) return spec.understood;
    const s = spec.schedule || {};
    if (s.type === "cron") return `cron ${s.cron}`;
    if (s.type === "interval") return `every ${s.interval_seconds} s`;
    if (s.type === "once") return `once at ${when(s.run_at)}`;
    return s.type || job.kind;
  }

  async function drawJobs() {
    const data = await get(`${base}/jobs`, { jobs: [] });
    if (!data.jobs.length) {
      replace(sections.jobs.body, h("p", { class: "empty" }, "No scheduled jobs."));
      return;
    }
    const rows = [];
    for (const job of data.jobs) {
      const open = openRuns.has(job.id);
      const toggle = h(
        "button",
        {
          type: "button",
          "aria-expanded": String(open),
          "aria-controls": `runs-${job.id}`,
          onclick: () => {
            if (openRuns.has(job.id)) openRuns.delete(job.id);
            else openRuns.add(job.id);
            drawJobs();
          },
        },
        open ? "Hide runs" : "Runs",
      );
      // A heartbeat has its own switch (below); other pending jobs pause and resume here.
      const path = `/jobs/${seg(job.id)}`;
      const change =
        job.kind === "heartbeat"
          ? ""
          : job.state === "active"
            ? h("button", { type: "button", onclick: () => act("Pause", () => api("POST", `${path}/pause`)) }, `Pause ${job.id}`)
            : job.state === "paused"
              ? h("button", { type: "button", onclick: () => act("Resume", () => api("POST", `${path}/resume`)) }, `Resume ${job.id}`)
              : "";
      rows.push(
        h(
          "tr",
          { "data-job": job.id },
          h("td", { "data-label": "Job" }, h("strong", {}, job.spec?.label || job.spec?.recall?.additional_context_message || job.spec?.deliver?.prompt || job.id), h("br"), h("code", { class: "hint" }, job.id)),
          h("td", { "data-label": "Kind" }, job.kind),
          h("td", { "data-label": "Schedule" }, schedule(job)),
          h("td", { "data-label": "State" }, pill(job.state)),
          h("td", { "data-label": "Next" }, job.next_fire_at ? time(job.next_fire_at) : "—"),
          h("td", { "data-label": "Runs" }, String(job.run_count), " ", toggle, change ? [" ", change] : ""),
        ),
      );
      if (open) {
        const { runs } = await api("GET", `/jobs/${seg(job.id)}`);
        rows.push(
          h(
            "tr",
            { id: `runs-${job.id}`, class: "runs" },
            h(
              "td",
              { colspan: 6 },
              runs.length
                ? h(
                    "table",
                    { class: "list inner" },
                    h("caption", {}, `Runs of ${job.id}, newest first`),
                    h("thead", {}, h("tr", {}, ["Scheduled for", "State", "Outcome"].map((t) => h("th", { scope: "col" }, t)))),
                    h(
                      "tbody",
                      {},
                      runs.map((run) =>
                        h(
                          "tr",
                          {},
                          h("td", { "data-label": "Scheduled for" }, time(run.scheduled_for)),
                          h("td", { "data-label": "State" }, pill(run.state)),
                          h("td", { "data-label": "Outcome" }, outcome(run.detail)),
                        ),
                      ),
                    ),
                  )
                : h("p", { class: "empty" }, "No runs yet."),
            ),
          ),
        );
      }
    }
    replace(
      sections.jobs.body,
      h(
        "table",
        { class: "list" },
        h("thead", {}, h("tr", {}, ["Job", "Kind", "Schedule", "State", "Next", "Runs"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, rows),
      ),
    );
  }

  function outcome(detail) {
    if (!detail) return "";
    const parts = [];
    if (detail.status) parts.push(detail.status);
    if (detail.error) parts.push(detail.error);
    if (detail.coalesced) parts.push(`${detail.coalesced} coalesced`);
    if (detail.reason) parts.push(detail.reason);
    return parts.join(" · ") || pretty(detail);
  }

  // ---- watchers ----
  const history = new Map(); // watcher id -> its status view, when opened

  async function drawWatchers() {
    const data = await get(`${base}/watchers`, { watchers: [] });
    if (!data.watchers.length) {
      replace(sections.watchers.body, h("p", { class: "empty" }, "No watchers."));
      return;
    }
    const cards = [];
    for (const w of data.watchers) {
      const name = w.label || w.tool_name;
      const detail = history.has(w.watcher_id) ? await api("GET", `/watchers/${seg(w.watcher_id)}`) : null;
      cards.push(
        h(
          "article",
          { class: "card watcher", "data-watcher": w.watcher_id, "aria-label": `Watcher ${name}` },
          h("h3", {}, name, " ", pill(w.status)),
          h(
            "p",
            {},
            h("code", {}, w.tool_name),
            ` every ${w.interval} s · ${w.check_count} checks · ${w.notification_count} notifications · `,
            w.consecutive_errors ? `${w.consecutive_errors} errors in a row · ` : "",
            "last ",
            w.last_check_at ? time(w.last_check_at) : "never",
            w.status === "running" && w.next_check_at ? [" · next ", time(w.next_check_at)] : "",
          ),
          h(
            "p",
            { class: "actions" },
            w.status === "paused"
              ? h("button", { type: "button", onclick: () => act("Resume", () => api("POST", `/watchers/${seg(w.watcher_id)}/resume`)) }, `Resume ${name}`)
              : h("button", { type: "button", onclick: () => act("Pause", () => api("POST", `/watchers/${seg(w.watcher_id)}/pause`)) }, `Pause ${name}`),
            h(
              "button",
              {
                type: "button",
                class: "danger",
                onclick: async () => {
                  const sure = await confirmDialog({ title: `Stop watcher ${name}?`, body: "It stops checking and its history is forgotten.", confirm: "Stop" });
                  if (sure) act("Stop", () => api("DELETE", `/watchers/${seg(w.watcher_id)}`));
                },
              },
              `Stop ${name}`,
            ),
            h(
              "button",
              {
                type: "button",
                "aria-expanded": String(detail !== null),
                onclick: () => {
                  if (history.has(w.watcher_id)) history.delete(w.watcher_id);
                  else history.set(w.watcher_id, true);
                  drawWatchers();
                },
              },
              detail ? "Hide history" : "History",
            ),
          ),
          detail ? watcherHistory(detail) : null,
        ),
      );
    }
    replace(sections.watchers.body, h("p", { class: "hint" }, `${data.running} running, ${data.paused} paused`), cards);
  }

  function watcherHistory(detail) {
    return h(
      "div",
      { class: "history" },
      h("p", { class: "label" }, "Last result"),
      h("pre", {}, pretty(detail.last_result ? (detail.last_result.ok ? detail.last_result.result : detail.last_result.error) : "none yet")),
      h(
        "ol",
        { class: "checks", reversed: true },
        (detail.recent_history || [])
          .slice()
          .reverse()
          .map((c) =>
            h("li", {}, time(c.at), " ", pill(c.ok ? "ok" : "failed", c.ok ? "completed" : "failed"), c.escalated ? pill("escalated", "queued") : null, " ", h("code", {}, String(c.ok ? c.result : c.error).slice(0, 200))),
          ),
      ),
    );
  }

  // ---- heartbeat ----
  async function drawHeartbeat() {
    const data = await get(`${base}/heartbeat`, null);
    if (data === null) {
      replace(sections.heartbeat.body, h("p", { class: "empty" }, "Heartbeats are not on this node."));
      return;
    }
    const hb = data.heartbeat;
    const interval = h("input", { id: "hb-interval", type: "number", min: 15, max: 1440, value: String(hb?.interval_minutes || 30), required: true });
    const checklist = h("textarea", { id: "hb-checklist", rows: 2, maxlength: 4000 });
    checklist.value = hb?.checklist || "";
    const set = (enabled) =>
      act(enabled ? "Enable the heartbeat" : "Disable the heartbeat", async () => {
        const args = { enabled };
        if (enabled) Object.assign(args, { interval_minutes: Number(interval.value), checklist: checklist.value });
        const result = await link.call(sessionId, "set_heartbeat", args);
        if (!result.ok) throw result.error;
      });
    const form = h(
      "form",
      {
        class: "heartbeat-form",
        onsubmit: (event) => {
          event.preventDefault();
          set(true);
        },
      },
      h("label", { for: "hb-interval" }, "Every (minutes)"),
      interval,
      h("label", { for: "hb-checklist" }, "Checklist"),
      checklist,
      h(
        "p",
        { class: "actions" },
        h("button", { type: "submit" }, hb?.enabled ? "Save" : "Enable heartbeat"),
        hb?.enabled ? h("button", { type: "button", class: "danger", onclick: () => set(false) }, "Disable heartbeat") : null,
      ),
    );
    const state = hb
      ? h("p", {}, pill(hb.enabled ? "enabled" : "disabled", hb.enabled ? "running" : "paused"), hb.next_run_at ? [" next ", time(hb.next_run_at)] : "", hb.session_id ? ` in ${hb.session_id}` : "")
      : h("p", { class: "empty" }, "No heartbeat set.");
    const runs = data.runs.length
      ? h(
          "table",
          { class: "list" },
          h("caption", {}, "Latest runs, newest first"),
          h("thead", {}, h("tr", {}, ["When", "State", "Suppressed", "What it found"].map((t) => h("th", { scope: "col" }, t)))),
          h(
            "tbody",
            {},
            data.runs.map((r) =>
              h(
                "tr",
                {},
                h("td", { "data-label": "When" }, time(r.scheduled_for)),
                h("td", { "data-label": "State" }, pill(r.state)),
                h("td", { "data-label": "Suppressed" }, r.suppressed ? "yes" : "no"),
                h("td", { "data-label": "What it found" }, r.error ? h("span", { class: "error" }, r.error) : r.response || ""),
              ),
            ),
          ),
        )
      : h("p", { class: "empty" }, "No runs yet.");
    // keep what the person is typing: redraw the form only when nothing in it has focus
    if (sections.heartbeat.body.contains(document.activeElement) && document.activeElement.closest("form")) {
      sections.heartbeat.body.querySelector(".hb-state").replaceChildren(state);
      sections.heartbeat.body.querySelector(".hb-runs").replaceChildren(runs);
      return;
    }
    replace(sections.heartbeat.body, h("div", { class: "hb-state" }, state), form, h("div", { class: "hb-runs" }, runs));
  }

  // ---- background tasks ----
  async function drawTasks() {
    const data = await get(`${base}/tasks`, { tasks: [] });
    if (!data.tasks.length) {
      replace(sections.tasks.body, h("p", { class: "empty" }, "No background tasks."));
      return;
    }
    replace(
      sections.tasks.body,
      h(
        "table",
        { class: "list" },
        h("thead", {}, h("tr", {}, ["Task", "Tool", "Status", "Started", "Elapsed", ""].map((t) => h("th", { scope: "col" }, t)))),
        h(
          "tbody",
          {},
          data.tasks.map((t) =>
            h(
              "tr",
              {},
              h("td", { "data-label": "Task" }, h("code", {}, t.task_id)),
              h("td", { "data-label": "Tool" }, h("code", {}, t.tool_name)),
              h("td", { "data-label": "Status" }, pill(t.status)),
              h("td", { "data-label": "Started" }, time(t.started_at)),
              h("td", { "data-label": "Elapsed" }, `${Math.round(t.elapsed_seconds)} s`),
              h(
                "td",
                { class: "actions" },
                t.status === "running"
                  ? h("button", { type: "button", class: "danger", onclick: () => act("Cancel", () => api("POST", `${base}/tasks/${seg(t.task_id)}/cancel`)) }, `Cancel ${t.task_id}`)
                  : null,
              ),
            ),
          ),
        ),
      ),
    );
  }

  // ---- buffered notifications ----
  async function drawNotifications() {
    const data = await get(`${base}/notifications`, { notifications: [], dropped: 0 });
    const items = data.notifications.map((n) =>
      h("li", {}, h("strong", {}, n.title || "Notification"), " ", n.priority !== "normal" ? pill(n.priority) : null, ` ${n.message} `, h("span", { class: "hint" }, `(${n.source}, `, time(n.created_at), ")")),
    );
    replace(
      sections.notifications.body,
      items.length ? h("ol", { class: "notifications" }, items) : h("p", { class: "empty" }, "Nothing waits: they reach the session when a client attaches."),
      data.dropped ? h("p", { class: "hint" }, `${data.dropped} dropped while nobody watched.`) : null,
    );
  }

  async function load() {
    const results = await Promise.allSettled([drawJobs(), drawWatchers(), drawHeartbeat(), drawTasks(), drawNotifications()]);
    const failed = results.find((r) => r.status === "rejected");
    if (failed) error.textContent = describe(failed.reason);
  }

  await load();
  const timer = setInterval(() => {
    if (!document.querySelector("dialog[open]")) load();
  }, REFRESH_MS);
  return () => clearInterval(timer);
}
