// A form generated from a provider's config_schema (keys: type, required, secret, label,
// description, placeholder, default, options, min, max). Values are checked by the server;
// its field-level errors (details.fields) are shown next to the fields.
import { h, uid } from "./dom.js";

function control(key, spec, value, ids) {
  const common = { id: ids.input, name: key, "aria-describedby": `${ids.help} ${ids.error}`,
    "aria-required": spec.required ? "true" : undefined };
  if (spec.secret) {
    // The server only ever sends the redacted value ("****" + last 4); sent back unchanged it keeps the stored secret.
    return h("input", { ...common, type: "password", autocomplete: "new-password", spellcheck: "false",
      value: value ?? "", placeholder: spec.placeholder || "" });
  }
  if (Array.isArray(spec.options) && spec.options.length) {
    const current = value ?? spec.default ?? "";
    return h("select", common, spec.options.map((opt) =>
      h("option", { value: String(opt), selected: String(opt) === String(current) }, opt === "" ? "(default)" : String(opt))));
  }
  if (spec.type === "boolean") {
    return h("input", { ...common, type: "checkbox", role: "switch", class: "switch", checked: Boolean(value ?? spec.default) });
  }
  if (spec.type === "integer" || spec.type === "number") {
    return h("input", { ...common, type: "number", inputmode: spec.type === "integer" ? "numeric" : "decimal",
      step: spec.type === "integer" ? "1" : "any", min: spec.min, max: spec.max,
      value: value ?? "", placeholder: spec.placeholder || (spec.default ?? "") });
  }
  if (spec.type === "list") {
    return h("textarea", { ...common, rows: 3, spellcheck: "false", placeholder: "one per line",
      value: Array.isArray(value) ? value.join("\n") : (value ?? "") });
  }
  return h("input", { ...common, type: "text", spellcheck: "false", value: value ?? "",
    placeholder: spec.placeholder || "" });
}

function range(spec) {
  if (spec.min === undefined && spec.max === undefined) return "";
  if (spec.min !== undefined && spec.max !== undefined) return ` Range ${spec.min} to ${spec.max}.`;
  return spec.min !== undefined ? ` At least ${spec.min}.` : ` At most ${spec.max}.`;
}

/** Build the fields; returns {element, values(), showErrors(fields), clearErrors()}. */
export function schemaForm(schema, values) {
  const fields = {};
  const element = h("div", { class: "fields" });
  for (const [key, spec] of Object.entries(schema || {})) {
    const base = uid(`f-${key}`);
    const ids = { input: base, help: `${base}-help`, error: `${base}-error` };
    const input = control(key, spec, values ? values[key] : undefined, ids);
    const error = h("p", { id: ids.error, class: "field-error", "aria-live": "polite" });
    const label = h("label", { for: ids.input }, spec.label || key,
      spec.required ? h("span", { class: "required", title: "required" }, " *") : null,
      spec.required ? h("span", { class: "sr-only" }, " (required)") : null);
    const help = h("small", { id: ids.help, class: "help" }, spec.description || "", range(spec),
      spec.default !== undefined && spec.default !== "" && !spec.secret ? ` Default: ${spec.default}.` : "");
    const row = h("div", { class: `field ${spec.type === "boolean" ? "field-switch" : ""}`, dataset: { field: key } },
      spec.type === "boolean" ? [input, label] : [label, input], help, error);
    fields[key] = { spec, input, error, row };
    element.append(row);
  }

  function values_() {
    const out = {};
    for (const [key, { spec, input }] of Object.entries(fields)) {
      if (spec.type === "boolean") { out[key] = input.checked; continue; }
      const raw = input.value;
      if (spec.type === "list") {
        const items = raw.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);
        if (items.length) out[key] = items;
        continue;
      }
      if (raw.trim() === "" && !(Array.isArray(spec.options) && spec.options.includes(""))) continue;
      if ((spec.type === "integer" || spec.type === "number") && !spec.options) {
        // An unparsable number goes as typed so the server's error names it.
        const n = Number(raw);
        out[key] = raw.trim() !== "" && Number.isFinite(n) ? n : raw;
        continue;
      }
      out[key] = raw;
    }
    return out;
  }

  function clearErrors() {
    for (const f of Object.values(fields)) {
      f.error.textContent = "";
      f.row.classList.remove("invalid");
      f.input.removeAttribute("aria-invalid");
    }
  }

  /** Shows each message next to its field; returns the messages that match no field. */
  function showErrors(errors) {
    clearErrors();
    const unmatched = {};
    let first = null;
    for (const [key, message] of Object.entries(errors || {})) {
      const f = fields[key] || fields[key.split(".")[0]];
      if (!f) { unmatched[key] = message; continue; }
      const prefix = `${key}: `;  // provider messages often repeat the field name
      f.error.textContent = String(message).startsWith(prefix) ? String(message).slice(prefix.length) : message;
      f.row.classList.add("invalid");
      f.input.setAttribute("aria-invalid", "true");
      first = first || f.input;
    }
    if (first) first.focus();
    return unmatched;
  }

  return { element, values: values_, showErrors, clearErrors };
}
