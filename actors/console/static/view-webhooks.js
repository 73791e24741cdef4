// Webhook deliveries: what reached your sessions (accepted, then delivered or dropped), what no
// session was bound to (unrouted), and, for [webhooks] admins, every request the node answered
// since it started by hook and outcome (duplicates and refusals included, which are not
// recorded as deliveries: a duplicate is the delivery already listed, a refusal was never
// trusted enough to keep).

import { ApiError, api, seg } from "./api.js";
import { add, describe, h, pill, replace, time } from "./dom.js";

export async function mount(root) {
  const error = h("p", { class: "error", role: "alert" });
  const everyone = h("input", { id: "webhooks-all", type: "checkbox", onchange: load });
  const adminToggle = h("label", { class: "checkbox", hidden: true }, everyone, " All users, with the node's counts");
  const counts = h("div", { class: "counts" });
  const list = h("div", { class: "deliveries" });
  add(root, 
    h("h1", {}, "Webhook deliveries"),
    h("p", { class: "inline-form" }, adminToggle, h("button", { type: "button", onclick: load }, "Refresh")),
    error,
    counts,
    list,
  );

  async function load() {
    let data;
    try {
      data = await api("GET", "/webhooks/deliveries", { query: { limit: 200, all_users: everyone.checked ? "true" : "" } });
      error.textContent = "";
    } catch (exc) {
      if (exc instanceof ApiError && exc.status === 404) {
        replace(list, h("p", { class: "empty" }, "Webhook ingress is not on this node."));
        return;
      }
      error.textContent = describe(exc);
      return;
    }
    drawCounts(data.counts);
    drawDeliveries(data.deliveries, everyone.checked);
  }

  function drawCounts(byHook) {
    if (!byHook) {
      counts.replaceChildren();
      return;
    }
    const hooks = Object.keys(byHook).sort();
    const outcomes = ["accepted", "unrouted", "duplicate", "ignored", "pong", "refused"];
    replace(
      counts,
      h("h2", {}, "Requests since the node started"),
      hooks.length
        ? h(
            "table",
            { class: "list" },
            h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Hook"), outcomes.map((o) => h("th", { scope: "col" }, o)))),
            h(
              "tbody",
              {},
              hooks.map((hook) => {
                const c = byHook[hook];
                const refused = Object.entries(c.refused || {});
                return h(
                  "tr",
                  { "data-hook": hook || "(unknown)" },
                  h("th", { scope: "row" }, hook || "(unknown hook)"),
                  outcomes.slice(0, -1).map((o) => h("td", { "data-label": o }, String(c[o] || 0))),
                  h(
                    "td",
                    { "data-label": "refused" },
                    String(refused.reduce((n, [, v]) => n + v, 0)),
                    refused.length ? h("span", { class: "hint" }, ` (${refused.map(([r, v]) => `${r} ${v}`).join(", ")})`) : null,
                  ),
                );
              }),
            ),
          )
        : h("p", { class: "empty" }, "No webhook requests yet."),
    );
  }

  function drawDeliveries(deliveries, all) {
    if (!deliveries.length) {
      replace(list, h("h2", {}, "Deliveries"), h("p", { class: "empty" }, "No deliveries recorded."));
      return;
    }
    replace(
      list,
      h("h2", {}, "Deliveries, newest first"),
      h(
        "table",
        { class: "list" },
        h(
          "thead",
          {},
          h("tr", {}, [all ? "User" : null, "Received", "Hook", "Event", "Source", "Outcome"].filter(Boolean).map((t) => h("th", { scope: "col" }, t))),
        ),
        h(
          "tbody",
          {},
          deliveries.map((d) =>
            h(
              "tr",
              { "data-delivery": d.delivery_id },
              all ? h("td", { "data-label": "User" }, d.owner || "—") : null,
              h("td", { "data-label": "Received" }, time(d.received_at)),
              h("td", { "data-label": "Hook" }, d.hook),
              h("td", { "data-label": "Event" }, d.event),
              h("td", { "data-label": "Source" }, h("code", {}, d.source_ref)),
              h("td", { "data-label": "Outcome" }, outcome(d)),
            ),
          ),
        ),
      ),
    );
  }

  function outcome(d) {
    if (d.state === "unrouted") return [pill("unrouted", "queued"), h("span", { class: "hint" }, " no session was bound to it")];
    return h(
      "ul",
      { class: "targets" },
      d.targets.map((t) =>
        h(
          "li",
          {},
          pill(t.state, t.state === "delivered" ? "completed" : t.state === "dropped" ? "failed" : "queued"),
          " ",
          h("a", { href: `#/sessions/${seg(t.session)}` }, t.session),
          t.input_id ? ` (input ${t.input_id})` : "",
          t.error ? h("span", { class: "error" }, ` ${t.error}`) : "",
        ),
      ),
    );
  }

  // Only [webhooks] admins may see every user's deliveries and the node's counts.
  async function probeAdmin() {
    try {
      await api("GET", "/webhooks/deliveries", { query: { all_users: "true", limit: 1 } });
      adminToggle.hidden = false;
    } catch {
      adminToggle.hidden = true;
    }
  }

  await Promise.all([load(), probeAdmin()]);
  return null;
}
