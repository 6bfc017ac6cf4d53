// Shared by the dashboard and the playground: API calls with the key (kept in this browser's localStorage,
// asked for when the server answers 401), and small DOM helpers. No libraries, nothing loaded from outside.
"use strict";

const radix = (() => {
  const KEY = "radixlm-api-key";

  function headers(extra) {
    const h = Object.assign({"Content-Type": "application/json"}, extra || {});
    const key = localStorage.getItem(KEY);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // Shows the key form; resolves once the user saved a key.
  function askKey(message) {
    const box = document.getElementById("keybox");
    if (!box || !box.hidden) return;
    box.hidden = false;
    box.querySelector(".why").textContent = message || "This server needs an API key.";
    const input = box.querySelector("input");
    input.focus();
    box.querySelector("form").onsubmit = (ev) => {
      ev.preventDefault();
      localStorage.setItem(KEY, input.value.trim());
      box.hidden = true;
    };
  }

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function call(path, opts) {
    opts = opts || {};
    const resp = await fetch(path, Object.assign({}, opts, {headers: headers(opts.headers)}));
    if (resp.status === 401) {
      askKey("The server refused the key (401). Enter the server's API key.");
      throw new ApiError(401, "API key needed");
    }
    if (!resp.ok) {
      let msg = resp.statusText;
      try { msg = (await resp.json()).error.message; } catch (e) { /* not JSON */ }
      throw new ApiError(resp.status, msg);
    }
    return resp;
  }

  async function json(path, opts) { return (await call(path, opts)).json(); }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("data-") || k === "title" || k === "style") e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c);
    return e;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(1) + "M";
    if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + "k";
    return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 2 : digits);
  }

  return {call, json, el, fmt, askKey, ApiError};
})();
