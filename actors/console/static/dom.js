// Small DOM and formatting helpers shared by the views. Everything the node sends is put in the
// page as text (textContent), never as HTML, so nothing a session holds can run as script.

/**
 * Create an element: h("button", {type: "button", onclick: f, "aria-label": "Stop"}, "Stop").
 * Attributes starting with "on" are listeners; `class`, `text`, `hidden`, `disabled`, `value`,
 * `checked` and `open` are set as properties; null/undefined/false attributes are left out.
 * Children may be strings, nodes, arrays of them, or null (skipped).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "text") {
      el.textContent = value;
    } else if (["hidden", "disabled", "value", "checked", "open", "required"].includes(name)) {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append `children` (strings, nodes, arrays of them; null skipped) to `el`. */
export function add(el, ...children) {
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** Remove every child of `el`, then append `children`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A date as the person's locale writes it (empty for none). */
export function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

/** How long ago: "just now", "5 min ago", "3 h ago", "2 days ago". */
export function ago(iso, now = Date.now()) {
  if (!iso) return "never";
  const seconds = Math.round((now - new Date(iso).getTime()) / 1000);
  if (seconds < 45) return "just now";
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

/** Time left until `iso` as h:mm:ss or m:ss (0:00 once it is due). */
export function countdown(iso, now = Date.now()) {
  const left = Math.max(0, Math.ceil((new Date(iso).getTime() - now) / 1000));
  const hours = Math.floor(left / 3600);
  const minutes = Math.floor((left % 3600) / 60);
  const seconds = String(left % 60).padStart(2, "0");
  if (hours) return `${hours}:${String(minutes).padStart(2, "0")}:${seconds}`;
  return `${minutes}:${seconds}`;
}

/** `<time>` showing `text`, with the full date in its datetime and title. */
export function time(iso, text = when(iso)) {
  return h("time", { datetime: iso || "", title: when(iso) }, text);
}

/** A value as indented JSON (strings as they are). */
export function pretty(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

/** A status word as a small labelled pill: pill("running"). */
export function pill(word, kind = word) {
  return h("span", { class: `pill pill-${String(kind).replace(/[^a-z_]/gi, "")}` }, word);
}

/** A random id for client_msg_id and call ids (crypto.randomUUID needs a secure context). */
export function randomId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Show a short message to the person (an assertive live region). */
export function notice(message) {
  const box = document.getElementById("notice");
  if (!box) return;
  box.textContent = message;
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => {
    box.hidden = true;
  }, 8000);
}

/** An API error as one line: its message, and the field it names. */
export function describe(error) {
  if (!error) return "";
  const field = error.field ? ` (${error.field})` : "";
  return `${error.message || String(error)}${field}`;
}

/**
 * Ask the person to confirm in a modal <dialog> (keyboard and focus handled by the browser).
 * `body` is a node or text; resolves true for the confirm button, false otherwise.
 */
export function confirmDialog({ title, body, confirm, danger = true }) {
  return new Promise((resolve) => {
    const heading = h("h2", { id: "dialog-title" }, title);
    const ok = h("button", { type: "submit", value: "yes", class: danger ? "danger" : "" }, confirm);
    const cancel = h("button", { type: "submit", value: "no", formnovalidate: true }, "Cancel");
    const dialog = h(
      "dialog",
      { "aria-labelledby": "dialog-title" },
      h("form", { method: "dialog" }, heading, h("div", { class: "dialog-body" }, body), h("p", { class: "actions" }, ok, cancel)),
    );
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(dialog.returnValue === "yes");
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  });
}
