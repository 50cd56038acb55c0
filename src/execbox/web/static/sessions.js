// Sessions page (admin): sessions across tenants and replicas with their age, idle time,
// execution count, lifecycle state (running, paused, lost...), owning replica and expiry;
// destroying one removes its box and workspace.
import { api } from "./api.js";
import { clear, confirmButton, describeError, duration, h, notice } from "./dom.js";

export async function render(root) {
  const filter = h("input", { id: "sessions-tenant", type: "text", spellcheck: "false", placeholder: "all tenants" });
  const status = h("div", { "aria-live": "polite" });
  const table = h("div", { id: "sessions-table" });
  const refresh = async (message) => {
    try {
      const q = filter.value.trim() ? `?tenant_id=${encodeURIComponent(filter.value.trim())}` : "";
      const res = await api("GET", `/v1/sandbox/sessions${q}`);
      paint(table, res.sessions, refresh);
      clear(status, message || null);
    } catch (err) {
      clear(status, notice("error", `Sessions could not be listed: ${describeError(err)}`));
    }
  };
  root.append(h("form", { class: "toolbar", novalidate: true, onsubmit: (ev) => { ev.preventDefault(); refresh(); } },
    h("label", { for: "sessions-tenant" }, "Tenant"), filter,
    h("button", { type: "submit", class: "secondary" }, "Refresh")), status, table);
  await refresh();
}

function paint(el, sessions, refresh) {
  if (!sessions.length) {
    clear(el, h("p", { class: "muted" }, "No live sessions. Runs with a session name in the Playground (or the API) create one."));
    return;
  }
  const now = Date.now() / 1000;
  clear(el, h("table", { class: "stack" },
    h("caption", { class: "sr-only" }, "Live sessions"),
    h("thead", {}, h("tr", {}, ["Tenant", "Session", "Provider", "Age", "Idle", "Executions", "State", "Lifecycle", "Owner", "Expires", ""].map(
      (c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, sessions.map((s) => h("tr", { dataset: { session: `${s.tenant_id}/${s.session_id}` } },
      h("td", { "data-label": "Tenant" }, s.tenant_id),
      h("td", { "data-label": "Session" }, s.session_id),
      h("td", { "data-label": "Provider" }, (s.provider || "-") + (s.runtime ? ` · runtime ${s.runtime}` : "")),
      h("td", { "data-label": "Age" }, duration(Math.max(0, now - s.created_at))),
      h("td", { "data-label": "Idle" }, s.idle_seconds == null ? "-" : duration(s.idle_seconds)),
      h("td", { "data-label": "Executions" }, s.operations == null ? "-" : String(s.operations)),
      h("td", { "data-label": "State" }, s.busy ? "running" : "idle"),
      h("td", { "data-label": "Lifecycle" }, s.state + (s.contexts_lost ? " (contexts lost)" : "")),
      h("td", { "data-label": "Owner" }, s.owner || "-"),
      h("td", { "data-label": "Expires" }, s.expires_at ? duration(Math.max(0, s.expires_at - now)) : "-"),
      h("td", { "data-label": "Actions" }, confirmButton("Destroy", `Destroy ${s.session_id}?`, async () => {
        try {
          await api("DELETE", `/v1/sandbox/sessions/${encodeURIComponent(s.tenant_id)}/${encodeURIComponent(s.session_id)}`);
          await refresh(notice("ok", `Destroyed session ${s.tenant_id}/${s.session_id}: its box and workspace are gone.`));
        } catch (err) {
          await refresh(notice("error", `Not destroyed: ${describeError(err)}`));
        }
      })))))));
}
