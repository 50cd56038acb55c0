// What execbox's two JavaScript entry points share (js_runner.js for one-shot runs,
// js_context.js for contexts): a value as JSON, an error as the user should read it (without
// execbox's frames), and the `require`/`module` the user's code gets.
"use strict";
// the globals used, taken before a cell can shadow them (`const JSON = ...`; js_cells.js)
const GLOBAL = globalThis;
const { JSON, Object, String, Error, TypeError, Number, BigInt, Array, Map, Math, process } = GLOBAL;
const Module = require("module");
const path = require("path");
const util = require("util");

function encode(value) {
  try {
    const text = JSON.stringify(value, (k, v) => {
      if (typeof v === "bigint") throw new TypeError("BigInt value is not JSON-serializable");
      if (typeof v === "number" && !Number.isFinite(v)) throw new TypeError(`${v} is not JSON-serializable`);
      return v;
    });
    if (text === undefined) throw new TypeError(`${typeof value} is not JSON-serializable`);
    return { present: true, json: text, type: Array.isArray(value) ? "array" : typeof value };
  } catch (e) {
    return { error: e.message };
  }
}

// What main() returned, as the result (undefined is a present null, as Python's None).
function encodeReturned(value) {
  if (value === undefined) return { present: true, json: "null", type: "undefined" };
  const encoded = encode(value);
  if (encoded.error) encoded.error = `main() returned a value that is not JSON-serializable: ${encoded.error}`;
  return encoded;
}

// The frames below the user's code are not theirs: the vm calls that ran it, and the runner's
// or context's own (or a wrapper's, see service/e2b_compat/cells.py), with Node's loader under
// them. As Python's runner shows a traceback from `<code>` down, this shows the stack down to there.
const MACHINERY = /^\s+at (?:new Script|createScript|Script\.runInThisContext|Object\.runInThisContext) \(node:vm[:)]/;
// The source line vm's displayErrors puts above a stack when the throw was in Node's own code
// (`require('nope')`: "node:internal/modules/cjs/loader:1210\n  throw err;\n  ^\n\n").
const INTERNAL_ARROW = /^node:internal\/[^\n]*:\d+\n[^\n]*\n[ \t]*\^+[ \t]*\n+/;
const FRAME = /^\s+at /;
const NODE_FRAME = /^\s+at (?:.* \()?node:[^)]*\)?$/;
const AGENT_DIR = __dirname + path.sep;

// A `Require stack:` list (in a module-not-found message) that names only execbox's own files
// says nothing about the user's code: it goes.
function dropAgentRequireStack(lines) {
  const at = lines.indexOf("Require stack:");
  if (at < 0) return lines;
  let end = at + 1;
  while (end < lines.length && lines[end].startsWith("- ")) end++;
  const listed = lines.slice(at + 1, end);
  if (listed.length === 0 || !listed.every((line) => line.slice(2).startsWith(AGENT_DIR))) return lines;
  return [...lines.slice(0, at), ...lines.slice(end)];
}

// An error (or any thrown value) as the user should read it: an Error's stack down to the
// user's code, a thrown object as util.inspect shows it (`throw {code: 42}` is `{ code: 42 }`,
// as `node -e` prints it), anything else as its string.
function userStack(e, ownFile) {
  if (!e || typeof e.stack !== "string") {
    return (e !== null && (typeof e === "object" || typeof e === "function")) ? util.inspect(e) : String(e);
  }
  let lines = dropAgentRequireStack(e.stack.replace(INTERNAL_ARROW, "").split("\n"));
  const cut = lines.findIndex((line) => MACHINERY.test(line)
    || (FRAME.test(line) && (line.includes(ownFile) || line.includes(AGENT_DIR))));
  if (cut > 0) lines = lines.slice(0, cut);
  // Node's own frames under the user's last one (the timer or microtask queue that called it),
  // or all of them where none is the user's (an import's loader).
  let end = lines.length;
  while (end > 0 && NODE_FRAME.test(lines[end - 1])) end--;
  return lines.slice(0, end).join("\n");
}

// Characters of an error's value and of its traceback, each (pump.ERROR_TEXT_CAP): head and tail kept.
const ERROR_TEXT_CAP = 16 * 1024;

function clipText(text) {
  if (text.length <= ERROR_TEXT_CAP) return text;
  const half = Math.max(Math.floor(ERROR_TEXT_CAP / 2) - 32, 0);
  return `${text.slice(0, half)}\n... [${text.length - 2 * half} characters cut] ...\n${text.slice(text.length - half)}`;
}

// What a thrown value says of itself, without letting a getter of the user's throw here.
function field(e, key) {
  try { return e[key]; } catch (err) { return undefined; }
}

// The run's structured error (E2B's and Jupyter's name/value/traceback) for a thrown value `e`
// whose text, as printed on stderr, is `text` (userStack's): an Error's name (`TypeError`, not
// Node's `TypeError [ERR_X]` stack heading) and message; another thrown value's constructor name
// and the text shown for it (`throw {code: 42}` is `Object`, `{ code: 42 }`; `throw null` is
// `null`, `null`). The traceback ends with a line break, as printed.
function errorOf(e, text) {
  const isObject = e !== null && (typeof e === "object" || typeof e === "function");
  let name = isObject ? field(e, "name") : undefined;
  if (typeof name !== "string" || name === "") {
    const ctor = isObject ? field(e, "constructor") : (e === null || e === undefined ? undefined : e.constructor);
    // `throw null` / `throw undefined` have no constructor: named as what was thrown
    name = ctor && typeof ctor.name === "string" && ctor.name ? ctor.name : (e === null || e === undefined ? String(e) : "Error");
  }
  const message = isObject ? field(e, "message") : undefined;
  const value = typeof message === "string" ? message : (isObject ? text : String(e));
  // the traceback as stderr has it, ending with its line break (as Python's does)
  const printed = String(text);
  return { name: name.slice(0, 200), value: clipText(value), traceback: clipText(printed.endsWith("\n") ? printed : `${printed}\n`) };
}

// The `require` and `module` the user's code gets: those of a file `name` in the directory the
// code runs in, as `node name` there would have, not the agent's own (whose module.paths,
// require.main and `Require stack:` name execbox's files and miss a node_modules in the
// workspace). `require` is read through a getter that resolves from the current directory
// (process.cwd()), so a context's cell (which runs in its request's cwd, or chdirs there as
// E2B's wrapper does) finds the node_modules and relative files of where it runs. NODE_PATH
// lookups stay: Node adds them to every module's search (Module.globalPaths).
function exposeUserModule(name) {
  const dir = process.cwd();
  const main = new Module(path.join(dir, name), null);
  main.filename = main.id;
  main.paths = Module._nodeModulePaths(dir);
  main.loaded = true;
  const made = new Map();
  let last = dir;
  function requireHere() {
    let cwd = last;
    try { cwd = last = process.cwd(); } catch (e) { /* the directory was removed: the last one */ }
    let req = made.get(cwd);
    if (req === undefined) {
      req = Module.createRequire(path.join(cwd, name));
      req.main = main;  // `require.main === module` holds, as for a script node runs
      made.set(cwd, req);
    }
    return req;
  }
  Object.defineProperty(GLOBAL, "require", {
    configurable: true,
    enumerable: false,
    get: requireHere,
    set(value) {  // `require = ...` in user code replaces it, as any other global
      Object.defineProperty(GLOBAL, "require", { value, writable: true, configurable: true, enumerable: true });
    },
  });
  GLOBAL.module = main;
  GLOBAL.exports = main.exports;
  process.mainModule = main;
  return main;
}

const AFTER_KEYWORD = /(?:^|[^\w$.])(?:return|typeof|case|do|else|in|of|new|delete|void|throw|instanceof|yield|await)$/;

// Whether a `/` here starts a regex literal, not a division: after an operator, an opening
// bracket or a keyword such as `return`, but not after `i++`, a name, a number or a closing
// bracket. `before`: the last characters of the blanked code before it, spaces collapsed.
function regexStarts(before) {
  const prev = before.trimEnd();
  if (prev === "") return true;
  const c = prev[prev.length - 1];
  if ((c === "+" || c === "-") && prev[prev.length - 2] === c) return false;  // i++ / 2
  if ("(,=:[!&|?{};~+-*%<>^".includes(c)) return true;
  return AFTER_KEYWORD.test(prev);
}

// Where the regex literal starting at `i` ends (after its flags).
function regexEnd(code, i) {
  let j = i + 1;
  let inClass = false;
  while (j < code.length && code[j] !== "\n") {
    const c = code[j];
    if (c === "\\") j++;
    else if (c === "[") inClass = true;
    else if (c === "]") inClass = false;
    else if (c === "/" && !inClass) break;
    j++;
  }
  j++;
  while (j < code.length && /[a-z]/i.test(code[j])) j++;
  return Math.min(j, code.length);
}

// The code with its comments and string, template and regex literals blanked (each character a
// space, line breaks kept, a literal's delimiters kept), so a word inside them ("in main") is not
// taken for code and what is found is where it is in the code. A template's `${...}` parts are
// code, read as such (a string or a template may be nested in them).
const PLAIN = /[/'"`{}]/g;

function blankCode(code) {
  const blanked = (from, to) => code.slice(from, to).replace(/[^\n]/g, " ");
  const depths = [];  // for each open `${`, how many of its own braces are open
  const parts = [];
  let tail = "";  // the last characters emitted, spaces collapsed: what regexStarts reads
  const emit = (text) => {
    parts.push(text);
    tail = (tail + (text.length > 32 ? text.slice(-32) : text)).replace(/\s+/g, " ").slice(-16);
  };
  let i = 0;
  while (i < code.length) {
    const c = code[i];
    const next = code[i + 1];
    let end;
    if (c === "/" && next === "/") {
      end = code.indexOf("\n", i);
      if (end < 0) end = code.length;
      emit(blanked(i, end));
    } else if (c === "/" && next === "*") {
      end = code.indexOf("*/", i + 2);
      end = end < 0 ? code.length : end + 2;
      emit(blanked(i, end));
    } else if (c === "/" && regexStarts(tail)) {
      end = regexEnd(code, i);
      emit("/" + blanked(i + 1, end));
    } else if (c === "'" || c === '"') {
      let j = i + 1;
      while (j < code.length && code[j] !== c && code[j] !== "\n") j += code[j] === "\\" ? 2 : 1;
      end = Math.min(j + 1, code.length);  // an unterminated literal runs to the line's end
      emit(c + blanked(i + 1, Math.min(j, code.length)) + (j < code.length ? code[j] : ""));
    } else if (c === "`" || (c === "}" && depths.length > 0 && depths[depths.length - 1] === 0)) {
      // a template's text, from its backtick (or the `}` that ends a `${`) to its end or next `${`
      if (c === "}") depths.pop();
      let j = i + 1;
      while (j < code.length && code[j] !== "`" && !(code[j] === "$" && code[j + 1] === "{")) {
        j += code[j] === "\\" ? 2 : 1;
      }
      emit(c + blanked(i + 1, Math.min(j, code.length)));
      if (j >= code.length) {
        end = code.length;
      } else if (code[j] === "`") {
        emit("`");
        end = j + 1;
      } else {
        emit("${");
        depths.push(0);
        end = j + 2;
      }
    } else if (c === "{" || c === "}") {
      if (depths.length > 0) depths[depths.length - 1] += c === "{" ? 1 : -1;
      emit(c);
      end = i + 1;
    } else {  // a run of plain code, up to the next character that may start or end something
      PLAIN.lastIndex = i + 1;
      end = PLAIN.test(code) ? PLAIN.lastIndex - 1 : code.length;
      emit(code.slice(i, end));
    }
    i = end;
  }
  return parts.join("");
}

// Whether the code uses the name `main` other than to define it: a call, `await main()`,
// `main().then(...)`, `setTimeout(main)`. Property names (`require.main`, `{ main: 1 }`) and
// the definition itself (`function main`, `const main =`) do not count.
function usesMain(code) {
  const text = blankCode(code);
  const word = /(?<![\w$.])main(?![\w$])/g;
  let m;
  while ((m = word.exec(text)) !== null) {
    const before = text.slice(Math.max(0, m.index - 40), m.index);
    const after = text.slice(m.index + 4);
    if (/(?:function\s*\*?|\b(?:const|let|var|class))\s*$/.test(before)) continue;
    if (/^\s*:(?!:)/.test(after) && /[{,]\s*$/.test(before)) continue;
    return true;
  }
  return false;
}

// Whether `arguments` name anything: `{}` does not (RAGFlow's /run always sends it), so a script
// without main() is then no error, as for Python (agent/runners.py).
function namesArguments(args) {
  return args !== null && typeof args === "object" && Object.keys(args).length > 0;
}

module.exports = { encode, encodeReturned, userStack, errorOf, exposeUserModule, usesMain, blankCode, namesArguments,
  FRAME, NODE_FRAME };
