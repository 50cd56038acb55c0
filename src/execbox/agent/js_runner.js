// execbox JavaScript runner: runs the user's code as a script, then calls main(args) when
// arguments were given or main is defined. The return value (awaited if a Promise) goes to
// fd 3 as JSON, never to stdout. argv: <code file> <arguments file or "">.
"use strict";
const fs = require("fs");
const vm = require("vm");
const { encode, userStack } = require("./js_common.js");

function send(msg) {
  try { fs.writeSync(3, JSON.stringify(msg)); } catch (e) { /* host went away */ }
}

function encodeReturned(value) {
  if (value === undefined) return { present: true, json: "null", type: "undefined" };
  const encoded = encode(value);
  if (encoded.error) encoded.error = `main() returned a value that is not JSON-serializable: ${encoded.error}`;
  return encoded;
}

async function run() {
  const code = fs.readFileSync(process.argv[2], "utf8");
  const argsFile = process.argv[3];
  const hasArgs = Boolean(argsFile);
  const args = hasArgs ? JSON.parse(fs.readFileSync(argsFile, "utf8")) : undefined;
  globalThis.require = require;
  globalThis.module = module;
  globalThis.exports = module.exports;
  globalThis.__filename = "<code>";
  globalThis.__dirname = process.cwd();
  vm.runInThisContext(code, { filename: "<code>" });
  const main = vm.runInThisContext("typeof main === 'function' ? main : undefined");
  if (typeof main === "function") {
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

run().catch((e) => {
  process.stderr.write(`${userStack(e, __filename)}\n`);
  if (e instanceof RangeError && /memory/i.test(String(e.message))) send({ oom: true });
  process.exitCode = 1;
});
