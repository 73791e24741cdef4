// Memory: the facts the node keeps about you, searched by meaning (then by words) and
// forgotten one by one; the summary; every user's facts for those with memory.read_all.

import { ApiError, api } from "./api.js";
import { add, confirmDialog, describe, h, replace, time } from "./dom.js";

/** Facts per page (the node's default [memory] max_search_limit). */
const PAGE = 50;

export async function mount(root) {
  const error = h("p", { class: "error", role: "alert" });
  const query = h("input", { id: "memory-query", type: "search", name: "query", maxlength: 500, autocomplete: "off" });
  const everyone = h("input", { id: "memory-all", type: "checkbox", onchange: load });
  const adminToggle = h("label", { class: "checkbox", hidden: true }, everyone, " All users");
  const results = h("div", { class: "memory-results", "aria-live": "polite" });
  const summary = h("div", { class: "summary" });

  add(root, 
    h("h1", {}, "Memory"),
    h(
      "form",
      {
        class: "inline-form",
        role: "search",
        onsubmit: (event) => {
          event.preventDefault();
          load();
        },
      },
      h("label", { for: "memory-query" }, "Search facts"),
      query,
      h("button", { type: "submit" }, "Search"),
      adminToggle,
    ),
    error,
    results,
    h("section", { "aria-labelledby": "h-summary" }, h("h2", { id: "h-summary" }, "Summary"), summary),
  );

  let offset = 0;
  let total = 0;

  async function load(event) {
    if (!(event && event.page)) offset = 0; // a new search starts at the first page
    const text = query.value.trim();
    let facts;
    let note;
    try {
      if (everyone.checked || !text) {
        const q = { search: text, limit: PAGE, offset };
        if (everyone.checked) q.all_users = "true";
        const data = await api("GET", "/memory/facts", { query: q });
        facts = data.facts;
        total = data.total;
        const who = everyone.checked ? " of every user" : "";
        const range = total > facts.length ? `, ${offset + 1}–${offset + facts.length} shown` : "";
        note = `${total} facts${who}${text ? ` matching “${text}”` : ""}${range}`;
      } else {
        facts = (await api("GET", "/memory/search", { query: { query: text, limit: PAGE } })).facts;
        total = facts.length;
        note = `${facts.length} facts for “${text}”, best first`;
      }
      error.textContent = "";
    } catch (exc) {
      if (exc instanceof ApiError && exc.status === 404) {
        replace(results, h("p", { class: "empty" }, "Memory is not on this node."));
        return;
      }
      error.textContent = describe(exc);
      return;
    }
    draw(facts, note, everyone.checked);
    const pages = [];
    if (offset > 0) pages.push(h("button", { type: "button", onclick: () => turnPage(-PAGE) }, "Previous page"));
    if (offset + facts.length < total && (everyone.checked || !text)) {
      pages.push(h("button", { type: "button", onclick: () => turnPage(PAGE) }, "Next page"));
    }
    if (pages.length) add(results, h("p", { class: "actions" }, pages));
  }

  function turnPage(by) {
    offset = Math.max(0, offset + by);
    load({ page: true });
  }

  function draw(facts, note, all) {
    if (!facts.length) {
      replace(results, h("p", { class: "empty" }, note.startsWith("0") ? "No facts." : note));
      return;
    }
    const heads = [all ? "User" : null, "Category", "Key", "Value", "Source", "Updated", all ? null : ""].filter((x) => x !== null);
    replace(
      results,
      h("p", { class: "hint" }, note),
      h(
        "table",
        { class: "list facts" },
        h("thead", {}, h("tr", {}, heads.map((t) => h("th", { scope: "col" }, t ? t : h("span", { class: "visually-hidden" }, "Actions"))))),
        h(
          "tbody",
          {},
          facts.map((f) =>
            h(
              "tr",
              { "data-key": f.key },
              all ? h("td", { "data-label": "User" }, f.owner || "") : null,
              h("td", { "data-label": "Category" }, f.category),
              h("td", { "data-label": "Key" }, h("code", {}, f.key)),
              h("td", { "data-label": "Value" }, f.value),
              h("td", { "data-label": "Source" }, f.source || ""),
              h("td", { "data-label": "Updated" }, time(f.updated_at)),
              all
                ? null
                : h(
                    "td",
                    { class: "actions" },
                    h("button", { type: "button", class: "danger", "aria-label": `Forget ${f.key}`, onclick: () => forget(f) }, "Forget"),
                  ),
            ),
          ),
        ),
      ),
    );
  }

  async function forget(fact) {
    const sure = await confirmDialog({ title: `Forget ${fact.key}?`, body: `${fact.category}: ${fact.value}`, confirm: "Forget" });
    if (!sure) return;
    try {
      await api("DELETE", "/memory/facts", { query: { key: fact.key, category: fact.category } });
    } catch (exc) {
      error.textContent = `Could not forget ${fact.key}: ${describe(exc)}`;
    }
    load();
  }

  async function loadSummary() {
    try {
      const data = await api("GET", "/memory/summary");
      replace(summary, data.summary ? [h("p", {}, data.summary), h("p", { class: "hint" }, "Updated ", time(data.updated_at))] : h("p", { class: "empty" }, "No summary yet."));
    } catch {
      replace(summary, h("p", { class: "empty" }, "No summary."));
    }
  }

  // Only those allowed to read every user's facts see the switch.
  async function probeAdmin() {
    try {
      await api("GET", "/memory/facts", { query: { all_users: "true", limit: 1 } });
      adminToggle.hidden = false;
    } catch {
      adminToggle.hidden = true;
    }
  }

  await Promise.all([load(), loadSummary(), probeAdmin()]);
  return null;
}
