// Providers page: a card per installed provider, a schema-generated form for the selected one
// (Save, Test connection, Set active) and the fallback order.
import { api } from "./api.js";
import { clear, describeError, h, notice } from "./dom.js";
import { schemaForm } from "./schema_form.js";

const state = { providers: [], config: {}, selected: null };

async function load() {
  const [list, config] = await Promise.all([
    api("GET", "/api/admin/sandbox/providers"),
    api("GET", "/api/admin/sandbox/config"),
  ]);
  state.providers = list.data;
  state.config = config;
}

export async function render(root) {
  const intro = h("p", { class: "lead" });
  const cards = h("div", { class: "cards", role: "list", "aria-label": "Installed providers" });
  const editor = h("div", { id: "provider-editor" });
  const fallback = h("div", { id: "fallback" });
  root.append(intro, cards, editor, fallback);
  await load();
  const paint = () => {
    paintIntro(intro);
    paintCards(cards, select);
    paintFallback(fallback, refresh);
  };
  const refresh = async () => { await load(); paint(); };
  const select = (name) => {
    state.selected = name;
    paintCards(cards, select);
    paintEditor(editor, refresh);
    editor.querySelector("h2")?.focus();
  };
  paint();
  if (state.selected) paintEditor(editor, refresh);
}

function paintIntro(el) {
  const active = state.config.active;
  const zero = state.config.zero_config;
  clear(el, active
    ? ["Active provider: ", h("strong", {}, active), ". New sessions use it; runs fall back in the order below when it fails."]
    : ["No provider is set active; ", zero && zero.provider
      ? ["zero-config uses ", h("strong", {}, zero.provider), zero.note ? ` (${zero.note})` : "", "."]
      : `zero-config found nothing usable${zero && zero.note ? `: ${zero.note}` : ""}.`]);
}

function effectiveActive() {
  return state.config.active || (state.config.zero_config && state.config.zero_config.provider) || null;
}

function paintCards(el, select) {
  const active = effectiveActive();
  clear(el, state.providers.map((p) => {
    const isActive = p.id === active;
    return h("article", { class: `card provider${p.id === state.selected ? " selected" : ""}`, role: "listitem",
      dataset: { provider: p.id }, "aria-labelledby": `card-${p.id}` },
    h("div", { class: "card-head" },
      h("h2", { id: `card-${p.id}` }, p.name),
      isActive ? h("span", { class: "badge active" }, state.config.active ? "active" : "active (zero-config)") : null,
      p.configured ? h("span", { class: "badge" }, "configured") : null),
    h("p", { class: "muted" }, p.description || ""),
    h("p", { class: "tags" },
      p.isolation ? h("span", { class: `tier tier-${p.isolation}`, title: "isolation tier" }, `isolation: ${p.isolation}`) : null,
      (p.tags || []).map((t) => h("span", { class: "tag" }, t))),
    h("p", { class: p.usable ? "usable" : "unusable" }, p.usable ? "Usable on this host" : `Not usable here: ${p.reason || "unknown reason"}`),
    h("button", { type: "button", class: "secondary", "aria-pressed": p.id === state.selected ? "true" : "false",
      onclick: () => select(p.id) }, `Configure ${p.name}`));
  }));
}

function paintEditor(el, refresh, message = null) {
  const p = state.providers.find((x) => x.id === state.selected);
  if (!p) return clear(el);
  const stored = state.config[p.id] || {};
  const form = schemaForm(p.config_schema, stored.error ? {} : stored);
  const status = h("div", { class: "status", "aria-live": "polite" }, message);
  const testOut = h("div", { class: "test-result" });
  const busy = (on) => { for (const b of el.querySelectorAll("button")) b.disabled = on; };

  async function save(ev) {
    ev.preventDefault();
    busy(true);
    clear(status, notice("info", "Saving…"));
    try {
      const res = await api("POST", "/api/admin/sandbox/config",
        { provider_type: p.id, config: form.values(), set_active: false });
      form.clearErrors();
      await refresh();
      clear(status, notice("ok", `Saved the ${p.name} configuration (version ${res.version}).`));
      // Show what the server stored (secrets come back redacted).
      for (const [key, value] of Object.entries(res.config || {})) {
        const input = el.querySelector(`[data-field="${CSS.escape(key)}"] input[type=password]`);
        if (input) input.value = value ?? "";
      }
    } catch (err) {
      const unmatched = form.showErrors(err.details && err.details.fields);
      const extra = Object.entries(unmatched).map(([k, v]) => `${k}: ${v}`).join("; ");
      const fields = err.details && err.details.fields ? Object.keys(err.details.fields).length - Object.keys(unmatched).length : 0;
      clear(status, notice("error", fields
        ? `Not saved: fix the ${fields === 1 ? "field" : `${fields} fields`} marked below.${extra ? ` Also: ${extra}` : ""} (${err.code})`
        : `Not saved: ${describeError(err)}`));
    } finally {
      busy(false);
    }
  }

  async function test() {
    busy(true);
    clear(status, notice("info", `Testing ${p.name}: starting an instance and running a probe…`));
    clear(testOut);
    try {
      const res = await api("POST", "/api/admin/sandbox/test", { provider_type: p.id, config: form.values() });
      form.clearErrors();
      clear(status);
      const d = res.details || {};
      clear(testOut, h("div", { class: `probe ${res.success ? "ok" : "fail"}`, role: "status" },
        h("p", { class: "probe-head" }, h("strong", {}, res.success ? "Connection OK" : "Connection failed"),
          ` · ${res.latency_ms} ms · exit code ${d.exit_code ?? "none"}`),
        h("p", {}, res.message),
        d.stdout ? [h("h3", {}, "stdout"), h("pre", { class: "out" }, d.stdout)] : null,
        d.stderr ? [h("h3", {}, "stderr"), h("pre", { class: "out err" }, d.stderr)] : null));
    } catch (err) {
      form.showErrors(err.details && err.details.fields);
      clear(status, notice("error", `Test not run: ${describeError(err)}`));
    } finally {
      busy(false);
    }
  }

  async function activate() {
    busy(true);
    try {
      await api("PUT", "/api/admin/sandbox/active", { provider: p.id });
      await refresh();
      paintEditor(el, refresh, notice("ok", `${p.name} is now the active provider.`));  // fresh buttons
    } catch (err) {
      busy(false);
      clear(status, notice("error", err.status === 409
        ? `${p.name} cannot be set active yet: ${err.message}. Save a valid configuration for it first. (${err.code})`
        : `Not switched: ${describeError(err)}`));
    }
  }

  clear(el, h("form", { class: "card editor", novalidate: true, onsubmit: save, "aria-labelledby": "editor-title" },
    h("h2", { id: "editor-title", tabindex: "-1" }, `${p.name} configuration`),
    p.usable ? null : notice("warn", `This provider is not usable on this host: ${p.reason}`),
    stored.error ? notice("error", `Stored configuration unreadable: ${stored.error.message} (${stored.error.code})`) : null,
    Object.keys(p.config_schema || {}).length ? form.element : h("p", {}, "This provider has no settings."),
    h("div", { class: "actions" },
      h("button", { type: "submit" }, "Save"),
      h("button", { type: "button", class: "secondary", onclick: test }, "Test connection"),
      h("button", { type: "button", class: "secondary", onclick: activate,
        disabled: state.config.active === p.id }, state.config.active === p.id ? "Active" : "Set active")),
    status, testOut));
}

function paintFallback(el, refresh) {
  const order = [...(state.config.fallback || [])];
  const status = h("div", { "aria-live": "polite" });
  const list = h("ol", { class: "fallback-list" });
  const addable = () => state.providers.filter((p) => !order.includes(p.id));
  const pick = h("select", { id: "fallback-add", "aria-label": "Provider to add" });
  const draw = () => {
    clear(list, order.length ? order.map((name, i) => h("li", {},
      h("span", { class: "fb-name" }, name),
      h("button", { type: "button", class: "icon", "aria-label": `Move ${name} up`, disabled: i === 0,
        onclick: () => { [order[i - 1], order[i]] = [order[i], order[i - 1]]; draw(); } }, "↑"),
      h("button", { type: "button", class: "icon", "aria-label": `Move ${name} down`, disabled: i === order.length - 1,
        onclick: () => { [order[i + 1], order[i]] = [order[i], order[i + 1]]; draw(); } }, "↓"),
      h("button", { type: "button", class: "icon", "aria-label": `Remove ${name}`,
        onclick: () => { order.splice(i, 1); draw(); } }, "✕"))) : h("li", { class: "muted" }, "No fallback: runs fail when the active provider fails."));
    clear(pick, addable().map((p) => h("option", { value: p.id }, p.name)));
  };
  draw();
  clear(el, h("section", { class: "card", "aria-labelledby": "fallback-title" },
    h("h2", { id: "fallback-title" }, "Fallback order"),
    h("p", { class: "help" }, "When the active provider fails to connect or is unavailable (SB003, SB009), runs are retried on these, in order."),
    list,
    h("div", { class: "actions" }, pick,
      h("button", { type: "button", class: "secondary", onclick: () => { if (pick.value) { order.push(pick.value); draw(); } } }, "Add"),
      h("button", { type: "button", onclick: async () => {
        try {
          const res = await api("PUT", "/api/admin/sandbox/fallback", { providers: order });
          state.config.fallback = res.providers;
          clear(status, notice("ok", `Fallback order saved: ${res.providers.join(" → ") || "none"}.`));
        } catch (err) {
          clear(status, notice("error", `Fallback not saved: ${describeError(err)}`));
        }
      } }, "Save fallback order")),
    status));
}
