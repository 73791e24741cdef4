// One WebSocket to the node's /ws for the whole tab (docs/protocol.md), kept open across views.
//
// A browser cannot set an Authorization header on a WebSocket, so the token travels as the
// `token` query parameter the gateway accepts for browsers; the gateway also checks the page's
// Origin (loopback is allowed by default, other origins must be in `allowed_origins`).
//
// When the socket drops, it reconnects with a growing delay and attaches every watched session
// again with `after_seq` set to the last event that session's view has shown, so the node
// replays exactly what was missed: no gap, and (the view also ignores any seq it has) no
// duplicate. A `lagged` error (the tab fell behind) is handled the same way.

import { randomId } from "./dom.js";

const DELAYS = [250, 500, 1000, 2000, 4000];

export class Link {
  /**
   * @param {string} token the person's bearer token
   * @param {(state: string) => void} onState "connecting" | "open" | "reconnecting" | "closed"
   * @param {() => void} onUnauthorized the node refused the token
   */
  constructor(token, onState, onUnauthorized) {
    this.token = token;
    this.onState = onState;
    this.onUnauthorized = onUnauthorized;
    this.ws = null;
    this.watchers = new Map(); // session id -> {lastSeq(), frame(f)}
    this.calls = new Map(); // call id -> {resolve, reject}
    this.attempt = 0;
    this.closed = false;
    this.timer = null;
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    if (this.closed) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/ws?token=${encodeURIComponent(this.token)}`;
    this.onState(this.attempt ? "reconnecting" : "connecting");
    const ws = new WebSocket(url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.attempt = 0;
      this.onState("open");
      for (const [sessionId, watcher] of this.watchers) this.attach(sessionId, watcher);
    });
    ws.addEventListener("message", (message) => this.dispatch(JSON.parse(message.data)));
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      for (const call of this.calls.values()) call.reject(new Error("the connection dropped"));
      this.calls.clear();
      if (event.code === 4401) {
        this.closed = true;
        this.onState("closed");
        this.onUnauthorized();
        return;
      }
      if (this.closed) return;
      this.onState("reconnecting");
      const delay = DELAYS[Math.min(this.attempt, DELAYS.length - 1)];
      this.attempt += 1;
      this.timer = setTimeout(() => this.connect(), delay);
    });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
    this.ws = null;
    this.onState("closed");
  }

  /** Send a frame now; false when the socket is not open (the caller keeps it to retry). */
  send(frame) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  /**
   * Watch a session: its frames go to `watcher.frame`, and it is attached now (if open) and
   * after every reconnect with after_seq = watcher.lastSeq(). Returns a function that stops.
   */
  watch(sessionId, watcher) {
    this.watchers.set(sessionId, watcher);
    if (this.open) this.attach(sessionId, watcher);
    return () => {
      if (this.watchers.get(sessionId) !== watcher) return;
      this.watchers.delete(sessionId);
      this.send({ type: "detach", session_id: sessionId });
    };
  }

  attach(sessionId, watcher = this.watchers.get(sessionId)) {
    if (!watcher) return;
    this.send({ type: "attach", session_id: sessionId, after_seq: watcher.lastSeq() });
  }

  /** Call a tool in a session's name (`call` frame); resolves with the `result` frame. */
  call(sessionId, tool, args) {
    return new Promise((resolve, reject) => {
      const id = randomId();
      if (!this.send({ type: "call", id, session_id: sessionId, tool, arguments: args })) {
        reject(new Error("not connected to the node; try again in a moment"));
        return;
      }
      this.calls.set(id, { resolve, reject });
    });
  }

  dispatch(frame) {
    if (frame.type === "result" || (frame.type === "error" && frame.id && this.calls.has(frame.id))) {
      const call = this.calls.get(frame.id);
      this.calls.delete(frame.id);
      if (call) call.resolve(frame.type === "result" ? frame : { ok: false, error: frame });
      return;
    }
    if (frame.type === "error" && frame.code === "lagged" && frame.session_id) {
      this.attach(frame.session_id); // catch up from the view's own last seq
      return;
    }
    const watcher = frame.session_id ? this.watchers.get(frame.session_id) : null;
    if (watcher) watcher.frame(frame);
    else if (frame.type === "error") window.dispatchEvent(new CustomEvent("turnstile:error", { detail: frame }));
  }
}
