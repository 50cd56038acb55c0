// Runtimes page (admin): runtime templates (`execbox runtime build NAME --pip ... --npm ...`),
// their current and older versions and packages. Sessions and runs pick one with runtime=NAME
// (or NAME@vN); the jail provider's `runtime` setting is the default. Builds are a CLI step.
import { api } from "./api.js";
import { clear, describeError, h, notice, when } from "./dom.js";

export async function render(root) {
  const status = h("div", { "aria-live": "polite" });
  const table = h("div", { id: "runtimes-table" });
  const refresh = async () => {
    try {
      const res = await api("GET", "/api/admin/runtimes");
      paint(table, res.data);
      clear(status);
    } catch (err) {
      clear(status, notice("error", `Runtimes could not be listed: ${describeError(err)}`));
    }
  };
  root.append(h("p", { class: "muted" },
    "Build or extend a template on the server with: execbox runtime build NAME --pip PKG --npm PKG [--from BASE] [--docker]. " +
    "A failed build keeps the current version."),
    h("form", { class: "toolbar", novalidate: true, onsubmit: (ev) => { ev.preventDefault(); refresh(); } },
      h("button", { type: "submit", class: "secondary" }, "Refresh")), status, table);
  await refresh();
}

function paint(el, rows) {
  clear(el, h("table", { class: "stack" },
    h("caption", { class: "sr-only" }, "Runtime templates"),
    h("thead", {}, h("tr", {}, ["Name", "Current", "Versions", "pip", "npm", "From", "Built"].map(
      (c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((r) => h("tr", { dataset: { runtime: r.name } },
      h("td", { "data-label": "Name" }, r.name),
      h("td", { "data-label": "Current" }, r.version || "-"),
      h("td", { "data-label": "Versions" }, (r.versions || []).join(" ") || "-"),
      h("td", { "data-label": "pip" }, (r.packages || []).join(" ") || "-"),
      h("td", { "data-label": "npm" }, (r.npm || []).join(" ") || "-"),
      h("td", { "data-label": "From" }, r.from || "-"),
      h("td", { "data-label": "Built" }, r.installed_at ? when(r.installed_at) : "-"))))));
}
