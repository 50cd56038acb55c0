// How a JavaScript context runs one cell: in V8's REPL mode, the mode Chrome's console and
// Deno's notebook kernel use, reached through an in-process inspector session (Node's public
// `inspector` module). A script run by `vm` cannot hold a top-level `await`, and a second
// `const x` in a later cell is a SyntaxError there; in REPL mode both work, as a notebook user
// expects, with the cell's completion value and its declarations kept in the context's globals.
//
// Module syntax is rewritten before the cell runs, because no script (REPL mode included) may
// hold it: `import d, {a as b} from "m"` becomes `const {default: d, a: b} = <check>(await
// <importer>("m"), ...)` on the same line (a name "m" does not export is a SyntaxError, as Node
// says), and `import(...)` calls the importer (a name as long as `import`, so columns stay),
// which resolves as a file `<cell>` in the cell's working directory would (then NODE_PATH),
// through the hooks the one-shot ES module path uses (js_esm_hooks.mjs). A cell that is an
// object literal (`{a: 1}`) is its value, as in Node's REPL. A Node without the inspector runs
// cells as plain scripts, as before.
//
// The globals this file uses are taken when it loads: a cell may declare `const JSON`,
// `let Promise` or `const process` of its own, which every later lookup by name would find.
"use strict";
const GLOBAL = globalThis;
const { JSON, Promise, Map, Symbol, Object, String, Error, SyntaxError, BigInt, Number, URL, URLSearchParams,
  process } = globalThis;
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

function post(method, params) {
  return new Promise((resolve, reject) => {
    session.post(method, params, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

let cells = 0;  // each evaluation's remote objects are a group of their own (a wrapper's cell nests)
// A remote object's live value is handed back to `taker`, under a number of its own (evaluations
// nest and interleave), by a function called on the taker's own remote object: it names no
// global a cell could have shadowed.
const TAKEN = new Map();
let takes = 0;
let takerId = null;
if (session !== null) {
  const key = Symbol("execbox.cell.taker");
  globalThis[key] = (id, value) => TAKEN.set(id, value);
  Object.defineProperty(globalThis, "__execbox_taker__", { value: key, configurable: true });
  session.post("Runtime.evaluate", { expression: "globalThis[globalThis.__execbox_taker__]", objectGroup: "execbox" },
    (err, res) => { if (!err && res.result) takerId = res.result.objectId; });  // answered at once
  delete globalThis.__execbox_taker__;
  delete globalThis[key];
}
const TAKE = "function (id, value) { this(id, value); }";

const IMPORTER = "$imprt";  // as long as `import`: a rewritten import() keeps every column
const CELL_IMPORT = "execbox:import?";  // js_esm_hooks.mjs resolves these from the given base

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

// The module's namespace, once every name the declaration imports is in it.
importHere.check = (ns, names, spec) => {
  for (const name of names) {
    if (!(name in ns)) throw new SyntaxError(`The requested module '${spec}' does not provide an export named '${name}'`);
  }
  return ns;
};
Object.defineProperty(globalThis, IMPORTER, { value: importHere, configurable: true, enumerable: false });

// `{a as b, default as c}` as the names imported and a destructuring pattern `{a: b, default: c}`.
function bindings(named) {
  const names = [];
  const pattern = named.split(",").map((n) => n.trim()).filter(Boolean).map((n) => {
    const m = /^([\w$]+)(?:\s+as\s+([\w$]+))?$/.exec(n);
    if (!m) return n;
    names.push(m[1]);
    return m[2] ? `${m[1]}: ${m[2]}` : m[1];
  });
  return { names, pattern };
}

const DECLARATION = /import\s*(?:([\w$]+)\s*(?:,\s*)?)?(?:\*\s*as\s+([\w$]+)\s*|\{([^}]*)\}\s*)?(?:from\s*)?(["'])[^"'\n]*\4(\s*(?:with|assert)\s*\{[^}]*\})?[ \t]*;?/y;

// Where the parenthesis opened at `at` (in blanked code) closes.
function closing(blank, at) {
  let depth = 0;
  for (let j = at; j < blank.length; j++) {
    if (blank[j] === "(") depth++;
    else if (blank[j] === ")" && --depth === 0) return j;
  }
  return -1;
}

// The cell with its module syntax as calls of the importer; each line where it was.
function rewriteImports(code) {
  if (!code.includes("import")) return code;
  const blank = blankCode(code);
  const word = /(?<![\w$.#])import(?![\w$])/g;
  let out = "";
  let last = 0;
  let m;
  while ((m = word.exec(blank)) !== null) {
    const at = m.index;
    const paren = /^\s*\(/.exec(blank.slice(at + 6, at + 64));
    if (paren) {  // import(...), unless a method of that name is defined: `{ import(x) {`
      const close = closing(blank, at + 6 + paren[0].length - 1);
      const member = /(?:^|[{};,*]|\b(?:static|async|get|set))\s*$/.test(blank.slice(Math.max(0, at - 64), at));
      if (member && close >= 0 && /^\s*\{/.test(blank.slice(close + 1, close + 64))) continue;
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
    // `with {type: "json"}` (or the older `assert`) goes along as import()'s options, on one line
    const written = attributes ? code.slice(at + end, at + end + attributes.length) : "";
    const options = attributes ? `, { with: ${written.trim().replace(/^(?:with|assert)\s*/, "").replace(/\s+/g, " ")} }` : "";
    const { names, pattern } = bindings(named || "");
    if (dflt) {
      names.unshift("default");
      pattern.unshift(`default: ${dflt}`);
    }
    const checked = `${IMPORTER}.check(await ${IMPORTER}(${from}${options}), ${JSON.stringify(names)}, ${from})`;
    let text;
    if (ns) text = `const ${ns} = ${checked};` + (pattern.length ? ` const {${pattern.join(", ")}} = ${ns};` : "");
    else if (pattern.length) text = `const {${pattern.join(", ")}} = ${checked};`;
    else text = `${checked};`;
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
    await post("Runtime.callFunctionOn", { objectId: takerId, functionDeclaration: TAKE,
      arguments: [{ value: id }, { objectId: remote.objectId }], silent: true });
    return TAKEN.get(id);
  } finally {
    TAKEN.delete(id);
  }
}

// A stack's text down to the first frame of the runner (this file's, the inspector's): the
// frames of the code the evaluation ran. A wrapper's cell that runs the user's as a cell of its
// own (E2B's, service/e2b_compat/cells.py) has `<cell>` frames of its own below them.
function ranFrames(stack) {
  const lines = String(stack).split("\n");
  const end = lines.findIndex((l) => /^\s+at /.test(l) && (l.includes(__filename) || l.includes("(node:inspector:")));
  return end < 0 ? lines.join("\n") : lines.slice(0, end).join("\n");
}

// Node's own form of a located syntax error (`<cell>:2`, the line, a caret), which a thrown
// SyntaxError of an evaluation does not carry. Only for the cell's own source, which did not
// parse: its error has no frames above the runner's. One with frames was thrown by running
// code: the cell's (JSON.parse; it has a `<cell>` frame) or Node's, for a module the cell
// imports, whose location is not the cell's, and whose error object Node keeps and throws again
// at every import of that module (so it is never changed here).
function locate(e, details, code) {
  if (!(e instanceof SyntaxError) || typeof e.stack !== "string" || /\n\s+at /.test(ranFrames(e.stack))
      || ranFrames(e.stack).includes("<cell>:")) return;
  const line = code.split("\n")[details.lineNumber];
  if (line === undefined) return;
  const column = Math.min(details.columnNumber, line.length);
  e.stack = `<cell>:${details.lineNumber + 1}\n${line}\n${" ".repeat(column)}^\n\n${e}`;
}

// `fn()` with SIGINT ending what it runs synchronously, as Node's REPL does (a vm script's
// breakOnSigint watchdog): the agent's interrupt of a cell past its time, or cancelled, ends its
// loop with ERR_SCRIPT_EXECUTION_INTERRUPTED and leaves the context's globals as they were. An
// inspector evaluation runs its cell synchronously within session.post, so the watchdog covers a
// cell up to its first `await` (an awaiting cell is interrupted by js_context.js).
const UNDER_SIGINT = new vm.Script("this.__execbox_call__()", { filename: __filename });

function underSigint(fn) {
  Object.defineProperty(GLOBAL, "__execbox_call__", { value: fn, configurable: true });
  try {
    return UNDER_SIGINT.runInThisContext({ breakOnSigint: true });
  } finally {
    delete GLOBAL.__execbox_call__;
  }
}

function evaluate(source, group) {
  const params = {
    expression: `${source}\n//# sourceURL=<cell>`, replMode: true, awaitPromise: true, objectGroup: group,
  };
  // an interrupted evaluation never answers: the interrupt is what the cell ends with
  return new Promise((resolve, reject) => {
    underSigint(() => session.post("Runtime.evaluate", params, (err, res) => (err ? reject(err) : resolve(res))));
  });
}

// A syntax error found before the cell ran (none of its frames is the cell's).
function unparsed(res) {
  const e = res.exceptionDetails && res.exceptionDetails.exception;
  return Boolean(e && e.className === "SyntaxError" && !/<cell>:\d+:\d+/.test(ranFrames(e.description)));
}

// Run one cell; its completion value (a top-level await settled first), or the thrown value.
async function runCell(code) {
  if (session === null || takerId === null) return vm.runInThisContext(code, { filename: "<cell>", breakOnSigint: true });
  const group = `execbox-cell-${++cells}`;
  try {
    const source = rewriteImports(code);
    let res;
    // `{a: 1}` alone (from `{` to `}`) is an object, not a block, as Node's REPL reads it; if it
    // does not parse so, it is read as it stands
    if (/^\s*\{/.test(code) && /\}\s*$/.test(code)) {
      res = await evaluate(`(${source}\n)`, group);
      if (unparsed(res)) res = null;
    }
    if (!res) res = await evaluate(source, group);
    if (res.exceptionDetails) {
      const d = res.exceptionDetails;
      const e = d.exception ? await live(d.exception) : new Error(d.text);
      locate(e, d, code);
      throw e;
    }
    return await live(res.result);
  } finally {
    session.post("Runtime.releaseObjectGroup", { objectGroup: group });
    // the session's console messages hold what the cell logged (up to 1000 messages, their
    // arguments alive): let them go, or every logged array stays in the context's heap
    session.post("Runtime.discardConsoleEntries");
  }
}

// A wrapper that runs the user's cell as a cell of its own (the E2B cell wrapper,
// service/e2b_compat/cells.py) finds this runner here.
Object.defineProperty(globalThis, Symbol.for("execbox.cell.run"), { value: runCell, configurable: true });

module.exports = { runCell, rewriteImports, underSigint };
