// Tokens page: create (the token is shown once, here, until dismissed), list, revoke.
import { api } from "./api.js";
import { clear, confirmButton, describeError, h, notice, when } from "./dom.js";

export async function render(root) {
  const tenant = h("input", { id: "tok-tenant", type: "text", required: true, spellcheck: "false",
    "aria-describedby": "tok-tenant-error", "aria-required": "true" });
  const tenantError = h("p", { id: "tok-tenant-error", class: "field-error", "aria-live": "polite" });
  const role = h("select", { id: "tok-role" }, h("option", { value: "tenant" }, "tenant (sandbox API, own tenant)"),
    h("option", { value: "admin" }, "admin (everything, this console)"));
  const name = h("input", { id: "tok-name", type: "text", spellcheck: "false", placeholder: "optional label" });
  const created = h("div", { id: "tok-created", "aria-live": "polite" });
  const status = h("div", { "aria-live": "polite" });
  const showRevoked = h("input", { id: "tok-show-revoked", type: "checkbox", role: "switch", class: "switch" });
  const table = h("div", { id: "tokens-table" });

  const refresh = async () => {
    try {
      const res = await api("GET", `/api/admin/tokens${showRevoked.checked ? "?include_revoked=true" : ""}`);
      paint(table, res.tokens, revoke);
    } catch (err) {
      clear(status, notice("error", `Tokens could not be listed: ${describeError(err)}`));
    }
  };
  async function revoke(t) {
    try {
      await api("DELETE", `/api/admin/tokens/${encodeURIComponent(t.id)}`);
      clear(status, notice("ok", `Revoked ${t.id} (${t.token}); requests using it are refused from now on.`));
    } catch (err) {
      clear(status, notice("error", `Not revoked: ${describeError(err)}`));
    }
    await refresh();
  }
  async function create(ev) {
    ev.preventDefault();
    tenantError.textContent = "";
    tenant.removeAttribute("aria-invalid");
    clear(created); clear(status);
    if (!tenant.value.trim()) {
      tenantError.textContent = "Enter the tenant this token acts for.";
      tenant.setAttribute("aria-invalid", "true");
      tenant.focus();
      return;
    }
    try {
      const res = await api("POST", "/api/admin/tokens",
        { tenant_id: tenant.value.trim(), role: role.value, name: name.value.trim() || null });
      const secret = h("input", { id: "tok-secret", type: "text", readonly: true, class: "code", value: res.secret,
        "aria-label": "New token", spellcheck: "false" });
      const done = h("button", { type: "button", class: "secondary", onclick: () => { secret.value = ""; clear(created); tenant.focus(); } }, "Done, hide it");
      clear(created, h("div", { class: "notice ok created-token", role: "status" },
        h("p", {}, h("strong", {}, `Token ${res.token.id} created for tenant ${res.token.tenant_id} (${res.token.role}).`),
          " Copy it now: it is shown only this once and cannot be recovered."),
        h("div", { class: "actions" }, secret,
          h("button", { type: "button", onclick: async () => {
            secret.select();
            try { await navigator.clipboard.writeText(res.secret); } catch { document.execCommand("copy"); }
          } }, "Copy"), done)));
      secret.focus();
      secret.select();
      name.value = "";
      await refresh();
    } catch (err) {
      const field = err.details && err.details.field;
      if (field === "tenant_id") {
        tenantError.textContent = `Tenant: ${err.message}`;
        tenant.setAttribute("aria-invalid", "true");
        tenant.focus();
      } else {
        clear(status, notice("error", `Token not created: ${describeError(err)}`));
      }
    }
  }
  showRevoked.addEventListener("change", refresh);
  root.append(
    h("form", { class: "card", novalidate: true, onsubmit: create, "aria-labelledby": "tok-new-title" },
      h("h2", { id: "tok-new-title" }, "New token"),
      h("div", { class: "row" },
        h("div", { class: "field" }, h("label", { for: "tok-tenant" }, "Tenant", h("span", { class: "required" }, " *"),
          h("span", { class: "sr-only" }, " (required)")), tenant, tenantError),
        h("div", { class: "field" }, h("label", { for: "tok-role" }, "Role"), role),
        h("div", { class: "field" }, h("label", { for: "tok-name" }, "Name"), name)),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Create token")),
      created),
    h("section", { class: "card", "aria-labelledby": "tok-list-title" },
      h("h2", { id: "tok-list-title" }, "Existing tokens"),
      h("div", { class: "field field-switch" }, showRevoked, h("label", { for: "tok-show-revoked" }, "Show revoked tokens")),
      status, table));
  await refresh();
}

function paint(el, tokens, revoke) {
  if (!tokens.length) return clear(el, h("p", { class: "muted" }, "No tokens."));
  clear(el, h("table", { class: "stack" },
    h("caption", { class: "sr-only" }, "API tokens"),
    h("thead", {}, h("tr", {}, ["Id", "Tenant", "Role", "Name", "Token", "Created", "Status", ""].map(
      (c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, tokens.map((t) => h("tr", { dataset: { token: t.id } },
      h("td", { "data-label": "Id" }, t.id),
      h("td", { "data-label": "Tenant" }, t.tenant_id),
      h("td", { "data-label": "Role" }, t.role),
      h("td", { "data-label": "Name" }, t.name || ""),
      h("td", { "data-label": "Token", class: "mono" }, t.token),
      h("td", { "data-label": "Created" }, when(t.created_at)),
      h("td", { "data-label": "Status" }, t.revoked ? "revoked" : t.current ? "active (you)" : "active"),
      h("td", { "data-label": "Actions" }, t.revoked ? "" : t.current
        ? h("span", { class: "muted" }, "signed in with this one")
        : confirmButton("Revoke", `Revoke ${t.id}?`, () => revoke(t))))))));
}
