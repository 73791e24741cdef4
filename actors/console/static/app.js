// The console's entry point: sign-in, the WebSocket link, and the router that mounts one view
// per page (#/sessions, #/sessions/<name>, #/automations/<name>, #/memory, #/webhooks).
// A view module exports mount(root, context) and may return a function that unmounts it.

import { ApiError, api, forgetToken, saveToken, savedToken } from "./api.js";
import { describe, h, notice, replace } from "./dom.js";
import { Link } from "./socket.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signOut = document.getElementById("sign-out");
const linkState = document.getElementById("link-state");

const VIEWS = {
  sessions: () => import("./view-sessions.js"),
  session: () => import("./view-session.js"),
  automations: () => import("./view-automations.js"),
  memory: () => import("./view-memory.js"),
  webhooks: () => import("./view-webhooks.js"),
};

const STATES = {
  connecting: "Connecting…",
  open: "Live",
  reconnecting: "Reconnecting…",
  closed: "",
};

let link = null;
let unmount = null;
let generation = 0;

/** #/sessions/abc -> {view: "session", arg: "abc"} */
function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const [first, second] = parts;
  if (first === "sessions" && second) return { view: "session", arg: second };
  if (first in VIEWS) return { view: first, arg: second || null };
  return { view: "sessions", arg: null };
}

async function show() {
  const mine = ++generation;
  if (unmount) {
    unmount();
    unmount = null;
  }
  if (!savedToken()) {
    showLogin();
    return;
  }
  const { view, arg } = route();
  for (const a of nav.querySelectorAll("a")) {
    const here = a.dataset.view === (view === "session" ? "sessions" : view);
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const module = await VIEWS[view]();
  if (mine !== generation) return; // another navigation won
  main.replaceChildren();
  unmount = (await module.mount(main, { link, arg, navigate })) || null;
  const heading = main.querySelector("h1");
  if (heading) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
}

function navigate(hash) {
  if (location.hash === hash) show();
  else location.hash = hash;
}

function startLink(token) {
  link = new Link(
    token,
    (state) => {
      linkState.textContent = STATES[state] || "";
      linkState.dataset.state = state;
    },
    () => leave("The node no longer accepts this token; sign in again."),
  );
  link.connect();
}

function leave(message) {
  forgetToken();
  if (link) link.close();
  link = null;
  nav.hidden = true;
  signOut.hidden = true;
  show();
  if (message) notice(message);
}

function showLogin() {
  nav.hidden = true;
  signOut.hidden = true;
  const error = h("p", { class: "error", role: "alert", id: "token-error" });
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "current-password",
    required: true,
    "aria-describedby": "token-hint token-error",
  });
  const form = h(
    "form",
    { class: "login", onsubmit: (event) => login(event, input, error) },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "Token"),
    input,
    h(
      "p",
      { class: "hint", id: "token-hint" },
      "Your bearer token. Where to find it: ./scripts/serve.sh (turnstile serve) prints the dev " +
        "user's when it starts, after \"dev token (user 'dev'):\", unless one was given with " +
        "--dev-token or TURNSTILE_DEV_TOKEN; other users' tokens are in the node's config, under " +
        "[[users]]. It is kept in this browser tab only and forgotten when the tab closes.",
    ),
    h("button", { type: "submit" }, "Sign in"),
    error,
  );
  replace(main, form);
  input.focus();
}

async function login(event, input, error) {
  event.preventDefault();
  const token = input.value.trim();
  if (!token) return;
  try {
    await api("GET", "/sessions", { query: { limit: 1 }, token });
  } catch (exc) {
    error.textContent =
      exc instanceof ApiError && exc.status === 401
        ? "This node does not know that token."
        : `Could not reach the node: ${describe(exc)}`;
    input.focus();
    return;
  }
  saveToken(token);
  enter(token);
}

function enter(token) {
  nav.hidden = false;
  signOut.hidden = false;
  startLink(token);
  if (!location.hash || location.hash === "#") location.hash = "#/sessions";
  else show();
}

// A link may carry the token in its fragment (never sent to the server): take it, then drop it
// from the address bar and the history.
function tokenFromFragment() {
  const match = location.hash.match(/^#token=([^&]+)/);
  if (!match) return;
  saveToken(decodeURIComponent(match[1]));
  history.replaceState(null, "", location.pathname + location.search + "#/sessions");
}

signOut.addEventListener("click", () => leave(""));
// the skip link moves focus without touching the fragment (the fragment is the router's)
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
window.addEventListener("hashchange", show);
window.addEventListener("turnstile:unauthorized", () => leave("The node refused this token; sign in again."));
window.addEventListener("turnstile:error", (event) => notice(describe(event.detail)));

tokenFromFragment();
if (savedToken()) enter(savedToken());
else show();
