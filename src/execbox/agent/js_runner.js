// execbox JavaScript runner: runs the user's code as a script, then calls main(args) when
// arguments were given, or main() when the code defines main and does not call it itself. The return value (awaited if a Promise) goes to
// fd 3 as JSON, never to stdout. argv: <code file> <arguments file or "">. Once they are read,
// the user's code sees process.argv as [node, "<code>"] and a require/module of its own
// (js_common.exposeUserModule), never the runner's paths.
"use strict";
const fs = require("fs");
const vm = require("vm");
const { encodeReturned, userStack, exposeUserModule, usesMain } = require("./js_common.js");

function send(msg) {
  try { fs.writeSync(3, JSON.stringify(msg)); } catch (e) { /* host went away */ }
}

function fail(e) {
  process.stderr.write(`${userStack(e, __filename)}\n`);
  if (e instanceof RangeError && /memory/i.test(String(e.message))) send({ oom: true });
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

async function run() {
  const code = fs.readFileSync(process.argv[2], "utf8");
  const argsFile = process.argv[3];
  const hasArgs = Boolean(argsFile);
  const args = hasArgs ? JSON.parse(fs.readFileSync(argsFile, "utf8")) : undefined;
  process.argv = [process.argv[0], "<code>"];
  exposeUserModule("<code>");
  globalThis.__filename = "<code>";
  globalThis.__dirname = process.cwd();
  vm.runInThisContext(code, { filename: "<code>" });
  const main = vm.runInThisContext("typeof main === 'function' ? main : undefined");
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
  } else if (hasArgs) {
    process.stderr.write("execbox: arguments were given but the code defines no main() function\n");
    process.exitCode = 1;
  }
}

run().catch(fail);
