// execbox JavaScript context: one long-lived Node process per context_id whose globals persist
// between cells (like the Python contexts). Requests arrive as JSON lines on fd 3
// ({code, cwd}); each cell runs as a script in this process's global scope (top-level
// `var`, `let`, `const`, functions stay defined), its completion value is awaited when it is a
// Promise (JSON when it fits, else Node's inspect() text), and the reply goes to fd 4 as one JSON line {exit_code, result}. stdout/stderr are
// the context's own pipes; Node writes pipes synchronously on Linux, so a cell's output is in
// them before its reply is written.
"use strict";
const fs = require("fs");
const net = require("net");
const vm = require("vm");
const util = require("util");
const readline = require("readline");
const { encode, userStack } = require("./js_common.js");

function reply(msg) {
  try { fs.writeSync(4, JSON.stringify(msg) + "\n"); } catch (e) { process.exit(0); }
}

globalThis.require = require;
globalThis.module = module;
globalThis.exports = module.exports;
globalThis.__filename = "<cell>";
process.on("uncaughtException", (e) => {  // a late callback's error must not end the context
  process.stderr.write((e && e.stack) ? `${e.stack}\n` : `${e}\n`);
});
process.on("unhandledRejection", (e) => {
  process.stderr.write((e && e.stack) ? `${e.stack}\n` : `${e}\n`);
});

async function handle(req) {
  let exitCode = 0;
  let result;
  try {
    try { process.chdir(req.cwd); } catch (e) { /* keep the last directory */ }
    globalThis.__dirname = process.cwd();
    let value = vm.runInThisContext(req.code, { filename: "<cell>" });
    if (value && typeof value.then === "function") value = await value;
    if (value !== undefined) {
      result = encode(value);
      // a value JSON cannot hold (a function, a Map, a cyclic object) is shown as Node shows it
      if (result.error) result = { present: true, json: JSON.stringify(util.inspect(value)), type: "inspect" };
    }
  } catch (e) {
    process.stderr.write(`${userStack(e, __filename)}\n`);
    exitCode = 1;
  }
  reply({ exit_code: exitCode, result, peak_memory_kb: Math.round(process.resourceUsage().maxRSS) });
}

let queue = Promise.resolve();
// A socket on the request pipe, not fs.createReadStream: that reads the pipe in a thread-pool
// read that process.exit() waits for, so a cell's late process.exit() hung until the next cell.
const requests = new net.Socket({ fd: 3, readable: true, writable: false });
const input = readline.createInterface({ input: requests, crlfDelay: Infinity });
input.on("line", (line) => { queue = queue.then(() => handle(JSON.parse(line))); });
input.on("close", () => process.exit(0));
