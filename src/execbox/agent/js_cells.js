// How a JavaScript context runs one cell: in V8's REPL mode, the mode Chrome's console and
// Deno's notebook kernel use, reached through an in-process inspector session (Node's public
// `inspector` module). A script run by `vm` cannot hold a top-level `await`, and a second
// `const x` in a later cell is a SyntaxError there; in REPL mode both work, as a notebook user
// expects, with the cell's completion value and its declarations kept in the context's globals.
//
// Module syntax is rewritten before the cell runs, because no script (REPL mode included) may
// hold it: `import d, {a as b} from "m"` becomes `const {default: d, a: b} = await
// <importer>("m");` on the same line, and `import(...)` calls the importer, which resolves as a
// file `<cell>` in the cell's working directory would (then NODE_PATH), through the hooks the
// one-shot ES module path uses (js_esm_hooks.mjs). A Node without the inspector runs cells as
// plain scripts, as before.
"use strict";
const vm = require("vm");
const path = require("path");
const Module = require("module");
const { pathToFileURL } = require("url");
const { blankCode } = require("./js_common.js");

let session = null;
try {
  const inspector = require("inspector");
  session = new inspector.Session();
  session.connect();
} catch (e) {
  session = null;  // a Node built without the inspector: cells run as scripts
}

let cells = 0;  // each evaluation's remote objects are a group of their own (a wrapper's cell nests)
// Where a remote object's live value is handed back, under a number of its own (evaluations
// nest and interleave); the handing function is strict, so `this` is not boxed.
const TAKEN = new Map();
Object.defineProperty(globalThis, Symbol.for("execbox.cell.taken"), { value: TAKEN, configurable: true });
let takes = 0;
const TAKE = `function (id) { "use strict"; globalThis[Symbol.for("execbox.cell.taken")].set(id, this); }`;
const IMPORTER = "__execbox_import__";
const CELL_IMPORT = "execbox:import?";  // js_esm_hooks.mjs resolves these from the given base

function post(method, params) {
  return new Promise((resolve, reject) => {
    session.post(method, params, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

let hooked = false;

// import() for a cell: what it names is resolved from the cell's working directory.
function importHere(specifier, options) {
  const spec = String(specifier);
  if (Module.isBuiltin(spec)) return import(spec);
  const base = pathToFileURL(path.join(process.cwd(), "<cell>")).href;
  if (!hooked && typeof Module.register === "function") {
    Module.register(pathToFileURL(path.join(__dirname, "js_esm_hooks.mjs")).href, { data: {} });
    hooked = true;
  }
  if (hooked) return import(CELL_IMPORT + new URLSearchParams({ specifier: spec, base }), options);
  return import(/^\.{0,2}\//.test(spec) ? new URL(spec, base).href : spec, options);
}
Object.defineProperty(globalThis, IMPORTER, { value: importHere, configurable: true, enumerable: false });

// `{a as b, default as c}` as a destructuring pattern `{a: b, default: c}`.
function pattern(names) {
  return names.split(",").map((n) => n.trim()).filter(Boolean)
    .map((n) => n.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, "$1: $2")).join(", ");
}

const DECLARATION = /import\s*(?:([\w$]+)\s*(?:,\s*)?)?(?:\*\s*as\s+([\w$]+)\s*|\{([^}]*)\}\s*)?(?:from\s*)?(["'])[^"'\n]*\4(\s*(?:with|assert)\s*\{[^}]*\})?[ \t]*;?/y;

// The cell with its module syntax as calls of the importer; each line where it was.
function rewriteImports(code) {
  if (!code.includes("import")) return code;
  const blank = blankCode(code);
  const word = /(?<![\w$.])import(?![\w$])/g;
  let out = "";
  let last = 0;
  let m;
  while ((m = word.exec(blank)) !== null) {
    const at = m.index;
    if (/^\s*\(/.test(blank.slice(at + 6, at + 64))) {  // import(...)
      out += code.slice(last, at) + IMPORTER;
      last = at + 6;
      continue;
    }
    if (!/(?:^|[;{}\n])\s*$/.test(blank.slice(Math.max(0, at - 256), at))) continue;  // not a statement
    DECLARATION.lastIndex = at;
    const d = DECLARATION.exec(blank);
    if (!d) continue;
    const [whole, dflt, ns, named, quote, attributes] = d;
    const q = whole.indexOf(quote);
    const end = whole.indexOf(quote, q + 1) + 1;
    const from = code.slice(at + q, at + end);  // the literal, as written
    // `with {type: "json"}` (or the older `assert`) goes along as import()'s options
    const written = attributes ? code.slice(at + end, at + end + attributes.length) : "";
    const options = attributes ? `, { with: ${written.trim().replace(/^(?:with|assert)\s*/, "")} }` : "";
    const call = `await ${IMPORTER}(${from}${options})`;
    const parts = [];
    if (dflt) parts.push(`default: ${dflt}`);
    if (named !== undefined && pattern(named)) parts.push(pattern(named));
    let text;
    if (ns) text = `const ${ns} = ${call};` + (parts.length ? ` const {${parts.join(", ")}} = ${ns};` : "");
    else if (parts.length) text = `const {${parts.join(", ")}} = ${call};`;
    else text = `${call};`;
    out += code.slice(last, at) + text + "\n".repeat((whole.match(/\n/g) || []).length);
    last = at + whole.length;
    word.lastIndex = last;
  }
  return out + code.slice(last);
}

// The live value a remote object stands for.
async function live(remote) {
  if (!remote || remote.type === "undefined") return undefined;
  if (remote.objectId === undefined) {
    if ("value" in remote) return remote.value;
    const u = String(remote.unserializableValue);
    return u.endsWith("n") ? BigInt(u.slice(0, -1)) : Number(u);
  }
  const id = ++takes;
  try {
    await post("Runtime.callFunctionOn", { objectId: remote.objectId, functionDeclaration: TAKE,
      arguments: [{ value: id }], silent: true });
    return TAKEN.get(id);
  } finally {
    TAKEN.delete(id);
  }
}

// Node's own form of a located syntax error (`<cell>:2`, the line, a caret), which a thrown
// SyntaxError of an evaluation does not carry.
function locate(e, details, code) {
  if (!(e instanceof SyntaxError) || typeof e.stack !== "string" || e.stack.includes("<cell>:")) return;
  const line = code.split("\n")[details.lineNumber];
  if (line === undefined) return;
  e.stack = `<cell>:${details.lineNumber + 1}\n${line}\n${" ".repeat(details.columnNumber)}^\n\n${e}`;
}

// Run one cell; its completion value (a top-level await settled first), or the thrown value.
async function runCell(code) {
  if (session === null) return vm.runInThisContext(code, { filename: "<cell>" });
  const group = `execbox-cell-${++cells}`;
  try {
    const res = await post("Runtime.evaluate", {
      expression: `${rewriteImports(code)}\n//# sourceURL=<cell>`,
      replMode: true, awaitPromise: true, objectGroup: group,
    });
    if (res.exceptionDetails) {
      const d = res.exceptionDetails;
      const e = d.exception ? await live(d.exception) : new Error(d.text);
      locate(e, d, code);
      throw e;
    }
    return await live(res.result);
  } finally {
    session.post("Runtime.releaseObjectGroup", { objectGroup: group });
  }
}

// A wrapper that runs the user's cell as a cell of its own (the E2B cell wrapper,
// service/e2b_compat/cells.py) finds this runner here.
Object.defineProperty(globalThis, Symbol.for("execbox.cell.run"), { value: runCell, configurable: true });

module.exports = { runCell, rewriteImports };
