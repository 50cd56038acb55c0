// Playground: run code through /v1/sandbox/execute and show output as it streams (SSE over
// fetch), then the result value, artifacts (raster images inline, other files as downloads), timing
// and the isolation tier.
import { INLINE_IMAGE_TYPES, api, blobFromBase64, stream } from "./api.js";
import { bytes, clear, describeError, duration, h, notice } from "./dom.js";
import { codeEditor } from "./editor.js";

const EXAMPLES = {
  python: `import matplotlib.pyplot as plt

def main(n=5):
    squares = [i * i for i in range(n)]
    print("squares:", squares)
    plt.plot(squares)
    plt.title("squares")
    return {"n": n, "sum": sum(squares)}
`,
  javascript: `function main(args) {
  const n = (args && args.n) || 5;
  const squares = Array.from({ length: n }, (_, i) => i * i);
  console.log("squares:", squares.join(", "));
  return { n, sum: squares.reduce((a, b) => a + b, 0) };
}
`,
  bash: `echo "hello from $(uname -s)"\nls -la\n`,
};

const form = { language: "python", code: EXAMPLES.python, args: '{"n": 5}', tenant: "", session: "", timeout: "" };
const objectUrls = [];

export async function render(root) {
  const ids = (n) => `pg-${n}`;
  const language = h("select", { id: ids("language"), name: "language" },
    ["python", "javascript", "bash"].map((l) => h("option", { value: l, selected: l === form.language }, l)));
  const code = h("textarea", { id: ids("code"), class: "code", rows: 14, spellcheck: "false", autocapitalize: "off",
    autocomplete: "off", wrap: "off", "aria-describedby": ids("code-help"), value: form.code });
  const args = h("textarea", { id: ids("args"), class: "code", rows: 3, spellcheck: "false",
    "aria-describedby": `${ids("args-help")} ${ids("args-error")}`, value: form.args });
  const argsError = h("p", { id: ids("args-error"), class: "field-error", "aria-live": "polite" });
  const tenant = h("input", { id: ids("tenant"), type: "text", spellcheck: "false", value: form.tenant,
    placeholder: "your token's tenant", "aria-describedby": ids("scope-help") });
  const session = h("input", { id: ids("session"), type: "text", spellcheck: "false", value: form.session,
    placeholder: "empty: one-shot run", "aria-describedby": ids("scope-help") });
  const timeout = h("input", { id: ids("timeout"), type: "number", min: "0.1", step: "any", inputmode: "decimal",
    placeholder: "provider default", value: form.timeout, "aria-describedby": ids("scope-help") });
  const run = h("button", { type: "submit", id: ids("run") }, "Run");
  const stop = h("button", { type: "button", class: "secondary", id: ids("stop"), disabled: true }, "Stop");
  const status = h("p", { id: ids("status"), class: "run-status", role: "status" }, "Ready.");
  const output = h("pre", { id: ids("output"), class: "out console", tabindex: "0", "aria-label": "Output" });
  const result = h("div", { id: ids("result") });
  const artifacts = h("div", { id: ids("artifacts"), class: "artifacts" });
  const errorBox = h("div", { id: ids("error"), "aria-live": "assertive" });

  language.addEventListener("change", () => {
    if (code.value === EXAMPLES[form.language]) code.value = EXAMPLES[language.value];
    form.language = language.value;
  });
  for (const [el, key] of [[code, "code"], [args, "args"], [tenant, "tenant"], [session, "session"], [timeout, "timeout"]]) {
    el.addEventListener("input", () => { form[key] = el.value; });
  }
  let controller = null;
  codeEditor(code, () => { if (!run.disabled) formEl.requestSubmit(); });

  function parseArgs() {
    argsError.textContent = "";
    args.removeAttribute("aria-invalid");
    if (!args.value.trim()) return null;
    try {
      const value = JSON.parse(args.value);
      if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error("must be a JSON object, like {\"n\": 5}");
      return value;
    } catch (e) {
      argsError.textContent = `Arguments are not valid: ${e.message}`;
      args.setAttribute("aria-invalid", "true");
      args.focus();
      throw e;
    }
  }

  async function execute(ev) {
    ev.preventDefault();
    let parsed;
    try { parsed = parseArgs(); } catch { return; }
    const body = { code: code.value, language: language.value, stream: true };
    if (parsed) body.arguments = parsed;
    if (tenant.value.trim()) body.tenant_id = tenant.value.trim();
    if (session.value.trim()) body.session_id = session.value.trim();
    if (timeout.value.trim()) body.timeout = Number(timeout.value);
    for (const url of objectUrls.splice(0)) URL.revokeObjectURL(url);
    clear(output); clear(result); clear(artifacts); clear(errorBox);
    run.disabled = true; stop.disabled = false;
    status.textContent = "Running…";
    status.dataset.state = "running";
    controller = new AbortController();
    const leave = () => controller && controller.abort();  // leaving the page cancels the run
    window.addEventListener("hashchange", leave);
    const started = performance.now();
    let final = null;
    let failed = null;
    try {
      await stream("/v1/sandbox/execute", body, (event, data) => {
        if (event === "stdout" || event === "stderr") {
          output.append(h("span", { class: event }, data.text));
          output.scrollTop = output.scrollHeight;
        } else if (event === "artifact") {
          showArtifact(artifacts, data, body);
        } else if (event === "result") {
          final = data;
        } else if (event === "error") {
          failed = data;
        }
      }, controller.signal);
    } catch (err) {
      failed = err.name === "AbortError" ? { message: "stopped: the run was cancelled", code: "" } : err;
    } finally {
      window.removeEventListener("hashchange", leave);
      run.disabled = false; stop.disabled = true; controller = null;
    }
    const wall = (performance.now() - started) / 1000;
    if (final) {
      const m = final.metadata || {};
      if (!output.childNodes.length) output.append(h("span", { class: "muted" }, "(no output)"));
      clear(result, h("dl", { class: "facts" },
        fact("Exit code", String(final.exit_code)),
        fact("Execution time", duration(final.execution_time)),
        fact("Round trip", duration(wall)),
        fact("Isolation", m.isolation || "unknown"),
        fact("Provider", m.provider || "unknown"),
        m.peak_memory_kb ? fact("Peak memory", bytes(m.peak_memory_kb * 1024)) : null,
        final.truncated ? fact("Output", "truncated at the provider's cap") : null,
        final.session_id ? fact("Session", `${final.tenant_id} / ${final.session_id}`) : fact("Session", "one-shot (box discarded)")),
      h("h2", {}, "Result value"),
      h("pre", { id: "pg-result-value", class: "out" },
        m.result_present || final.result !== null ? JSON.stringify(final.result, null, 2) : "(no return value)"));
    }
    if (final && !final.artifacts.length && !artifacts.childNodes.length) artifacts.append(h("p", { class: "muted" }, "No artifacts."));
    status.dataset.state = failed ? "failed" : "done";
    status.textContent = failed ? "Failed." : `Finished: exit code ${final ? final.exit_code : "?"} in ${duration(final ? final.execution_time : wall)}.`;
    if (failed) errorBox.append(notice("error", `The run failed: ${describeError(failed)}`));
  }

  stop.addEventListener("click", () => { if (controller) controller.abort(); });
  const formEl = h("form", { class: "card playground", novalidate: true, onsubmit: execute, "aria-label": "Run code" },
    h("div", { class: "row" },
      h("div", { class: "field" }, h("label", { for: ids("language") }, "Language"), language),
      h("div", { class: "field" }, h("label", { for: ids("tenant") }, "Tenant"), tenant),
      h("div", { class: "field" }, h("label", { for: ids("session") }, "Session"), session),
      h("div", { class: "field" }, h("label", { for: ids("timeout") }, "Timeout (s)"), timeout)),
    h("small", { id: ids("scope-help"), class: "help" },
      "Leave the session empty for a one-shot run in a fresh box; name one to keep its workspace and see it on the Sessions page. The tenant defaults to your token's; the timeout to the provider's."),
    h("div", { class: "field" }, h("label", { for: ids("code") }, "Code"), code,
      h("small", { id: ids("code-help"), class: "help" }, "Tab indents, Shift+Tab dedents; press Esc then Tab to leave the editor. Ctrl+Enter runs.")),
    h("div", { class: "field" }, h("label", { for: ids("args") }, "Arguments (JSON)"), args,
      h("small", { id: ids("args-help"), class: "help" }, "Passed to main(**arguments) in Python, main(arguments) in JavaScript. Leave empty to run a plain script."),
      argsError),
    h("div", { class: "actions" }, run, stop, status));
  root.append(formEl, h("section", { class: "card", "aria-labelledby": "pg-out-title" },
    h("h2", { id: "pg-out-title" }, "Output"), output, errorBox, result,
    h("h2", {}, "Artifacts"), artifacts));
}

function fact(name, value) {
  return h("div", {}, h("dt", {}, name), h("dd", {}, value));
}

async function showArtifact(box, art, body) {
  const item = h("figure", { class: "artifact", dataset: { name: art.name } },
    h("figcaption", {}, `${art.name} · ${art.mime_type} · ${bytes(art.size)}`));
  box.append(item);
  try {
    let blob;
    if (art.content_b64) {
      blob = blobFromBase64(art.content_b64, art.mime_type);
    } else {
      const fetched = await api("POST", "/v1/sandbox/read_binary",
        (art.fetch && art.fetch.json) || { tenant_id: body.tenant_id, session_id: body.session_id, path: art.path || art.name });
      blob = blobFromBase64(fetched.content_b64, art.mime_type);
    }
    const url = URL.createObjectURL(blob);
    objectUrls.push(url);
    if (INLINE_IMAGE_TYPES.has(blob.type)) {  // raster only: SVG & co. are downloads (api.js)
      item.prepend(h("img", { src: url, alt: `${art.name} (image produced by the run)` }));
    } else {
      item.append(h("a", { href: url, download: art.name }, `Download ${art.name}`));
    }
  } catch (err) {
    item.append(notice("error", `Could not load ${art.name}: ${describeError(err)}`));
  }
}
