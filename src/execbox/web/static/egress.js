// Egress page (admin): every connection attempt of every box through the egress gateway
// (allowed, denied, limited), filterable by tenant, session and decision, with totals.
import { api } from "./api.js";
import { bytes, clear, describeError, h, notice, when } from "./dom.js";

export async function render(root) {
  const tenant = h("input", { id: "egress-tenant", type: "text", spellcheck: "false", placeholder: "all tenants" });
  const session = h("input", { id: "egress-session", type: "text", spellcheck: "false", placeholder: "all sessions" });
  const decision = h("select", { id: "egress-decision" },
    ["", "allowed", "denied", "limited"].map((d) => h("option", { value: d }, d || "any decision")));
  const status = h("div", { "aria-live": "polite" });
  const totals = h("p", { id: "egress-totals", class: "muted" });
  const table = h("div", { id: "egress-table" });
  const refresh = async () => {
    const q = new URLSearchParams({ limit: "200" });
    if (tenant.value.trim()) q.set("tenant_id", tenant.value.trim());
    if (session.value.trim()) q.set("session_id", session.value.trim());
    if (decision.value) q.set("decision", decision.value);
    try {
      const res = await api("GET", `/api/admin/egress/audit?${q}`);
      clear(totals, Object.entries(res.counts).map(([k, n]) => `${k}: ${n}`).join(" · ") || "No egress yet.");
      paint(table, res.data);
      clear(status);
    } catch (err) {
      clear(status, notice("error", `Egress audit could not be read: ${describeError(err)}`));
    }
  };
  root.append(h("form", { class: "toolbar", novalidate: true, onsubmit: (ev) => { ev.preventDefault(); refresh(); } },
    h("label", { for: "egress-tenant" }, "Tenant"), tenant,
    h("label", { for: "egress-session" }, "Session"), session,
    h("label", { for: "egress-decision" }, "Decision"), decision,
    h("button", { type: "submit", class: "secondary" }, "Refresh")), status, totals, table);
  await refresh();
}

function paint(el, rows) {
  if (!rows.length) {
    clear(el, h("p", { class: "muted" }, "No connection attempts match. Boxes have network only when a provider's network is allowlist or open."));
    return;
  }
  clear(el, h("table", { class: "stack" },
    h("caption", { class: "sr-only" }, "Egress connection attempts, newest first"),
    h("thead", {}, h("tr", {}, ["When", "Tenant", "Session", "Destination", "Decision", "Reason", "Up", "Down", "ms"].map(
      (c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((r) => h("tr", { dataset: { decision: r.decision } },
      h("td", { "data-label": "When" }, when(r.ts)),
      h("td", { "data-label": "Tenant" }, r.tenant_id || "-"),
      h("td", { "data-label": "Session" }, r.session_id || "-"),
      h("td", { "data-label": "Destination" }, `${r.host || r.ip || "?"}${r.port ? ":" + r.port : ""}${r.injected ? " (credentials)" : ""}`),
      h("td", { "data-label": "Decision" }, r.decision),
      h("td", { "data-label": "Reason" }, r.reason || ""),
      h("td", { "data-label": "Up" }, bytes(r.bytes_up)),
      h("td", { "data-label": "Down" }, bytes(r.bytes_down)),
      h("td", { "data-label": "ms" }, String(Math.round(r.duration_ms))))))));
}
