// execbox JavaScript runner: runs the user's code as a script (or, with `import`, `export` or
// top-level `await`, as an ES module), then calls main(args) when arguments were given, or main()
// when the code defines main and does not call it itself. The return value (awaited if a
// Promise) goes to fd 3 as JSON, never to stdout. argv: <code file> <arguments file or "">. Once they are read,
// the user's code sees process.argv as [node, "<code>"] and a require/module of its own
// (js_common.exposeUserModule), never the runner's paths.
"use strict";
const fs = require("fs");
const vm = require("vm");
const { encodeReturned, userStack, errorOf, exposeUserModule, usesMain, namesArguments, FRAME, NODE_FRAME } = require("./js_common.js");

function send(msg) {
  try { fs.writeSync(3, JSON.stringify(msg)); } catch (e) { /* host went away */ }
}

function fail(e) {
  let text = userStack(e, __filename);
  if (moduleCode !== null) {  // the module's frames name execbox:code; Node's loader frames are not the user's
    text = text.split(ENTRY).join("<code>").split("\n")
      .filter((line) => !NODE_FRAME.test(line) && !(FRAME.test(line) && line.includes(__dirname))).join("\n");
    if (e instanceof SyntaxError && !text.startsWith("<code>:")) text = moduleSyntaxError(moduleCode) + text;
  }
  process.stderr.write(`${text}\n`);
  if (e instanceof RangeError && /memory/i.test(String(e.message))) send({ oom: true });
  send({ error: errorOf(e, text) });  // the run's structured error (pump.parse_result keeps the first)
  process.exitCode = 1;
}

// An error from a timer or callback, or a rejection nobody handled, ends the run as Node's
// default would (at once, exit code 1, later callbacks not run), but printed as the user's
// error: without Node's source line of the runner, its frames and its version line.
process.on("uncaughtException", (e) => {
  fail(e);
  process.exit(1);
});
process.on("unhandledRejection", (reason) => {
  if (!(reason instanceof Error)) process.stderr.write("execbox: a promise was rejected and nothing handled it: ");
  fail(reason);
  process.exit(1);
});

// `console.log(await x)` fails as a script with "missing ) after argument list", not with the
// top-level-await message: code that parses once inside an async function uses top-level await.
function awaitsAtTopLevel(code) {
  if (!code.includes("await")) return false;
  try {
    new vm.Script(`(async () => {\n${code}\n})`);
    return true;
  } catch (e) {
    return false;
  }
}

// What V8 says when a script uses syntax only a module may: the code is then run as one.
const MODULE_ONLY = /Cannot use import statement outside a module|await is only valid in async functions and the top level bodies of modules|Unexpected token 'export'|Cannot use 'import\.meta' outside a module/;
const ENTRY = "execbox:code";  // js_esm_hooks.mjs serves the code under this URL

// The code as an ES module: its imports resolve from the working directory (and NODE_PATH) via
// js_esm_hooks.mjs. A syntax error in it has no location in its stack (Node 18/20 keep that
// apart), so Node's syntax check, run on the code, says where.
async function runModule(code) {
  const Module = require("module");
  const { pathToFileURL } = require("url");
  moduleCode = code;
  Module.register(pathToFileURL(require("path").join(__dirname, "js_esm_hooks.mjs")).href,
    { data: { code, cwd: process.cwd() } });
  return import(ENTRY);
}

let moduleCode = null;

function moduleSyntaxError(code) {
  const { spawnSync } = require("child_process");
  const check = spawnSync(process.execPath, ["--input-type=module", "--check"], { input: code, encoding: "utf8" });
  const text = String(check.stderr || "");
  const at = text.search(/^SyntaxError: /m);
  return at > 0 && text.startsWith("[stdin]:") ? text.slice(0, at).replace(/^\[stdin\]/, "<code>") : "";
}

async function run() {
  const code = fs.readFileSync(process.argv[2], "utf8");
  const argsFile = process.argv[3];
  const hasArgs = Boolean(argsFile);
  const args = hasArgs ? JSON.parse(fs.readFileSync(argsFile, "utf8")) : undefined;
  const named = hasArgs && namesArguments(args);
  process.argv = [process.argv[0], "<code>"];
  exposeUserModule("<code>");
  globalThis.__filename = "<code>";
  globalThis.__dirname = process.cwd();
  let script;
  try {
    script = new vm.Script(code, { filename: "<code>" });
  } catch (e) {
    if (!(MODULE_ONLY.test(e && e.message) || awaitsAtTopLevel(code))) throw e;
    script = null;
  }
  let main;
  if (script) {
    script.runInThisContext();
    main = vm.runInThisContext("typeof main === 'function' ? main : undefined");
  } else {  // `import`, `export`, top-level await: an ES module, as `node` runs such a file
    const ns = await runModule(code);
    main = typeof ns.main === "function" ? ns.main : undefined;
  }
  // With arguments, main is ours to call; without, unless the program calls it itself
  // (`main();`, `main().catch(...)`, `setTimeout(main)`): it would run twice.
  if (typeof main === "function" && (hasArgs || !usesMain(code))) {
    let value = hasArgs ? main(args) : main();
    if (value && typeof value.then === "function") value = await value;
    const encoded = encodeReturned(value);
    if (encoded.error) {
      process.stderr.write(`execbox: ${encoded.error}\n`);
      process.exitCode = 1;
    } else {
      send({ result: encoded });
    }
  } else if (named) {
    process.stderr.write(script ? "execbox: arguments were given but the code defines no main() function\n"
      : "execbox: arguments were given but the module exports no main() function (export function main)\n");
    process.exitCode = 1;
  }
}

run().catch(fail);
