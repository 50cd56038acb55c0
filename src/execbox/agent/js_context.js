// execbox JavaScript context: one long-lived Node process per context_id whose globals persist
// between cells (like the Python contexts). Requests arrive as JSON lines on fd 3
// ({code, cwd, arguments}); each cell runs in this process's global scope as js_cells.js says
// (top-level `await`, `import`, declarations that stay defined and may be declared again), its
// completion value is awaited when it is a Promise (JSON when it fits, else Node's inspect()
// text), and the reply goes to fd 4 as one JSON
// line {exit_code, result, error, peak_memory_kb} (error: the cell's uncaught exception as
// {name, value, traceback}, or null; a callback's error or an unhandled rejection of the cell
// raised before it answers counts too, see uncaught; printed on stderr as well, unless the cell
// asked otherwise, see quiet). With arguments, main(arguments) is
// called after the cell (a main() an earlier cell defined counts) and what it returns is the result, as in a
// one-shot run. stdout/stderr are the context's own pipes; Node writes pipes synchronously on
// Linux, so a cell's output is in them before its reply is written.
"use strict";
// the globals used, taken before a cell can shadow them (`const JSON = ...`; js_cells.js)
const GLOBAL = globalThis;
const { JSON, Promise, Map, Set, Math, Number, Error, process } = GLOBAL;
const fs = require("fs");
const net = require("net");
const vm = require("vm");
const util = require("util");
const readline = require("readline");
const { AsyncLocalStorage } = require("async_hooks");
const { setImmediate } = require("timers");
const { encode, encodeReturned, userStack, errorOf, exposeUserModule, namesArguments } = require("./js_common.js");
const { runCell, underSigint } = require("./js_cells.js");

function reply(msg) {
  try { fs.writeSync(4, JSON.stringify(msg) + "\n"); } catch (e) { process.exit(0); }
}

// A cell sees Node's REPL argv and a require/module of its own (js_common.exposeUserModule),
// never the context's paths.
process.argv = [process.argv[0]];
exposeUserModule("<cell>");
// The global console also reports each call to the inspector, whose session (js_cells.js) would
// keep up to 1000 messages with their arguments alive (every array a cell logged); a console of
// the same streams does not.
const cellConsole = new console.Console({ stdout: process.stdout, stderr: process.stderr });
cellConsole.Console = console.Console;
GLOBAL.console = cellConsole;
GLOBAL.__filename = "<cell>";

// An error from a callback or a rejection nobody handled does not end the context. Each cell runs
// in an async scope of its own (AsyncLocalStorage: its timers, promises and callbacks carry it),
// so such an error is known by the cell that started the work. Raised before that cell has
// answered (a cell waits one macrotask turn before it does: see settle), it is that cell's
// error, on its stderr, as an uncaught exception in it; raised later (a timer that fires after),
// it is no cell's `error`: it is printed on the stderr of whatever runs then (the next cell's),
// after a line saying so.
const cellScope = new AsyncLocalStorage();
let running = null;  // the cell being handled until it answers: {error, quiet}

// The cell's error `e` (its text as printed: `text`), unless it has one already; on stderr too,
// unless the cell is quiet and this is its error (a second one is printed: it is nowhere else).
function failed(cell, e, text, note) {
  const first = cell.error === null;
  if (first) cell.error = errorOf(e, text);
  if (!(first && cell.quiet)) process.stderr.write(`${note}${text}\n`);
}

// A cell that calls this (E2B's cell wrapper, service/e2b_compat/cells.py, as its first step)
// has its error (thrown, rejected, or a callback's or rejection's before it answers) as its
// reply's `error` only, not printed on stderr too: a Jupyter kernel sends a traceback as its
// error message only, so E2B's `logs.stderr` holds what the cell wrote itself (as
// py_cells.report does for a Python cell). What a cell prints itself is untouched.
Object.defineProperty(GLOBAL, Symbol.for("execbox.cell.quiet"), {
  value: () => { if (running !== null) running.quiet = true; },
  configurable: true,
});

function uncaught(e, note) {
  const text = userStack(e, __filename);
  const cell = cellScope.getStore();
  if (running !== null && (cell === running || cell === undefined)) {
    failed(running, e, text, note);
  } else {
    process.stderr.write(`execbox: an error after its cell had answered (not this cell's): ${note}${text}\n`);
  }
}
process.on("uncaughtException", (e) => uncaught(e, ""));
process.on("unhandledRejection", (reason) => {
  uncaught(reason, reason instanceof Error ? "" : "execbox: a promise was rejected and nothing handled it: ");
});

// One turn of the event loop (what the cell left to run at once: microtasks, and the rejections
// nobody handled, which Node reports once they have run).
function settle() {
  return new Promise((resolve) => setImmediate(resolve));
}

// The agent's interrupt (SIGINT) of a cell past its time, or cancelled, as a notebook's: a cell
// running synchronously is ended by js_cells.underSigint, one awaiting here; either way the cell
// ends with Node's ERR_SCRIPT_EXECUTION_INTERRUPTED and the globals stay. Between cells it is
// nothing (the agent repeats it until the cell answers). What an awaiting cell left pending
// (a timer, a fetch) is not cancelled: a promise cannot be, as in Node's REPL.
let interruptCell = null;
process.on("SIGINT", () => { if (interruptCell !== null) interruptCell(); });

function interrupted() {
  const e = new Error("Script execution was interrupted by `SIGINT`");
  e.code = "ERR_SCRIPT_EXECUTION_INTERRUPTED";
  return e;
}

function interruptible(promise) {
  return new Promise((resolve, reject) => {
    interruptCell = () => reject(interrupted());
    promise.then(resolve, reject);
  }).finally(() => { interruptCell = null; });
}

// A cell's own peak memory, not the process's lifetime one: the high-water mark (VmHWM) is
// reset before the cell ("5" to clear_refs) and read after it; maxRSS where /proc cannot be used.
function resetPeak() {
  try { fs.writeFileSync("/proc/self/clear_refs", "5"); } catch (e) { /* not on this kernel */ }
}

function peakKb() {
  try {
    const m = /^VmHWM:\s*(\d+)\s*kB/m.exec(fs.readFileSync("/proc/self/status", "utf8"));
    if (m) return Number(m[1]);
  } catch (e) { /* no /proc */ }
  return Math.round(process.resourceUsage().maxRSS);
}

async function handle(req) {
  const cell = { error: null, quiet: false };
  running = cell;
  try {
    await cellScope.run(cell, () => runRequest(req, cell));
  } finally {
    running = null;
  }
}

async function runRequest(req, cell) {
  let exitCode = 0;
  let result;
  try {
    try { process.chdir(req.cwd); } catch (e) { /* keep the last directory */ }
    GLOBAL.__dirname = process.cwd();
    resetPeak();
    let value = await interruptible(runCell(req.code));
    if (value && typeof value.then === "function") value = await interruptible(value);
    if (req.arguments != null) {  // as a one-shot run: main(arguments) is the result
      const main = vm.runInThisContext("typeof main === 'function' ? main : undefined");
      if (typeof main !== "function") {
        if (namesArguments(req.arguments)) {
          process.stderr.write("execbox: arguments were given but the code defines no main() function\n");
          exitCode = 1;
        }
      } else {
        value = underSigint(() => main(req.arguments));
        if (value && typeof value.then === "function") value = await interruptible(value);
        result = encodeReturned(value);
        if (result.error) {
          process.stderr.write(`execbox: ${result.error}\n`);
          result = undefined;
          exitCode = 1;
        }
      }
    } else if (value !== undefined) {
      // a value JSON cannot hold (a function, a cyclic object) or would empty (a Map, a Set: `{}`)
      // is shown as Node shows it
      result = value instanceof Map || value instanceof Set ? { error: "a Map or Set" } : encode(value);
      if (result.error) result = { present: true, json: JSON.stringify(util.inspect(value)), type: "inspect" };
    }
  } catch (e) {
    const stopped = e instanceof Error && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED";
    failed(cell, e, stopped ? `Error [${e.code}]: ${e.message}` : userStack(e, __filename), "");
  }
  await settle();
  if (cell.error !== null) {  // the cell's uncaught error, or a callback's or rejection's of it
    exitCode = 1;
    result = undefined;
  }
  reply({ exit_code: exitCode, result, error: cell.error, peak_memory_kb: peakKb() });
}

let queue = Promise.resolve();
// A socket on the request pipe, not fs.createReadStream: that reads the pipe in a thread-pool
// read that process.exit() waits for, so a cell's late process.exit() hung until the next cell.
const requests = new net.Socket({ fd: 3, readable: true, writable: false });
const input = readline.createInterface({ input: requests, crlfDelay: Infinity });
input.on("line", (line) => { queue = queue.then(() => handle(JSON.parse(line))); });
input.on("close", () => process.exit(0));
