// The node's HTTP API, with the token of this browser tab. Errors come back as ApiError with the
// answer's code, message and field ({"error": {...}} bodies, docs/protocol.md).

const STORAGE_KEY = "turnstile.token";

/** The token kept for this tab only (sessionStorage: gone when the tab closes). */
export function savedToken() {
  return sessionStorage.getItem(STORAGE_KEY);
}

export function saveToken(token) {
  sessionStorage.setItem(STORAGE_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(STORAGE_KEY);
}

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `the node answered ${status}`);
    this.status = status;
    this.code = error.code || "http_" + status;
    this.field = error.field || null;
    this.body = body;
  }
}

/**
 * Call the API: api("GET", "/sessions", {query: {has_recall: true}}).
 * Resolves with the decoded JSON (null for 204); rejects with ApiError. A 401 also dispatches
 * "turnstile:unauthorized" on window, so the console can ask for a token again, unless the
 * call named its own `token` (signing in tries one).
 */
export async function api(method, path, { query, body, token } = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  const headers = { Authorization: `Bearer ${token || savedToken() || ""}` };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url, init);
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 401 && !token) window.dispatchEvent(new Event("turnstile:unauthorized"));
    throw new ApiError(response.status, data);
  }
  return data;
}

/** A session name in a path (names follow the id rule, but encode anyway). */
export function seg(name) {
  return encodeURIComponent(name);
}
