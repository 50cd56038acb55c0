// Small DOM helpers. Text always goes in through textContent (never innerHTML), so nothing a
// provider, a run or a user returns can become markup.

/** h("button", {class: "x", onclick: f}, "text", child) -> element */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value" || key === "checked") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** An error in words: "message (SB002)", plus the status when it says something. */
export function describeError(err) {
  if (!err) return "";
  if (err.code) return `${err.message} (${err.code}${err.status ? `, HTTP ${err.status}` : ""})`;
  return err.message || String(err);
}

export function notice(kind, text) {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "-";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

export function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

export function when(epochSeconds) {
  return new Date(epochSeconds * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

/** A two-step button: first press asks, second press (on "confirm") acts. */
export function confirmButton(label, question, action) {
  const wrap = h("span", { class: "confirm" });
  const start = h("button", { type: "button", class: "danger", onclick: ask }, label);
  wrap.append(start);
  function ask() {
    const yes = h("button", { type: "button", class: "danger", onclick: async () => {
      yes.disabled = true;
      try { await action(); } finally { reset(); }
    } }, `Yes, ${label.toLowerCase()}`);
    const no = h("button", { type: "button", class: "secondary", onclick: () => { reset(); start.focus(); } }, "Cancel");
    clear(wrap, h("span", { class: "question" }, question), yes, no);
    yes.focus();
  }
  function reset() { if (wrap.isConnected) clear(wrap, start); }
  return wrap;
}
