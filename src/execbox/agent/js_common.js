// What execbox's two JavaScript entry points share (js_runner.js for one-shot runs,
// js_context.js for contexts): a value as JSON, and an error's stack without execbox's frames.
"use strict";

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

// The frames below the user's code are not theirs: the vm calls that ran it, and the runner's
// or context's own (or a wrapper's, see service/e2b_compat/cells.py), with Node's loader under
// them. As Python's runner shows a traceback from `<code>` down, this shows the stack down to there.
const MACHINERY = /^\s+at (?:new Script|createScript|Script\.runInThisContext|Object\.runInThisContext) \(node:vm[:)]/;

function userStack(e, ownFile) {
  if (!e || typeof e.stack !== "string") return `${e}`;
  const lines = e.stack.split("\n");
  const cut = lines.findIndex((line) => MACHINERY.test(line) || (/^\s+at /.test(line) && line.includes(ownFile)));
  return (cut > 0 ? lines.slice(0, cut) : lines).join("\n");
}

module.exports = { encode, userStack };
