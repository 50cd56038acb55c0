// Module hooks for a one-shot run whose code is an ES module (js_runner.js: `import`, `export`,
// top-level `await`). The code is served from memory as the module `execbox:code` (no file, so
// no agent path in import.meta.url or a stack); what it imports resolves as if it were a file
// `<code>` in the run's working directory: `./lib.mjs` from there, packages from its
// node_modules, and, as for require(), from NODE_PATH (runtime templates, in-session installs),
// which Node's own ESM resolution ignores. A context cell's imports (js_cells.js) resolve the same
// way from the cell's working directory.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ENTRY = "execbox:code";
// A context cell's import (js_cells.js): `execbox:import?specifier=...&base=<cell's file URL>`.
const CELL_IMPORT = "execbox:import?";
let state;

export async function initialize(data) {
  if (data && data.code !== undefined) {
    const where = path.join(data.cwd, "<code>");
    state = { code: data.code, base: pathToFileURL(where).href, require: createRequire(where) };
  }
}

export async function resolve(specifier, context, next) {
  if (specifier === ENTRY) return { url: ENTRY, shortCircuit: true };
  if (specifier.startsWith(CELL_IMPORT)) {
    const query = new URLSearchParams(specifier.slice(CELL_IMPORT.length));
    const base = query.get("base");
    return resolveFrom(query.get("specifier"), base, () => createRequire(fileURLToPath(base)), context, next);
  }
  const parentURL = context.parentURL === ENTRY ? state.base : context.parentURL;
  // what a cell's import imports in turn: NODE_PATH as seen from the importing file
  const requireFrom = () => (state ? state.require
    : parentURL && parentURL.startsWith("file:") ? createRequire(fileURLToPath(parentURL)) : null);
  return resolveFrom(specifier, parentURL, requireFrom, context, next);
}

// NODE_PATH's node_modules directories (runtime templates, in-session installs): a package there
// resolves as an import resolves it (its exports map's "import" condition, an ES-module-only
// package), from a file inside the directory; require.resolve, the last resort, knows only the
// "require" condition.
const NODE_PATH = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean);

// `requireFrom`: the require() of the last resort, made only when it is needed.
async function resolveFrom(specifier, parentURL, requireFrom, context, next) {
  try {
    return await next(specifier, { ...context, parentURL });
  } catch (e) {
    const bare = /^[^./]/.test(specifier) && !specifier.includes(":");
    if (!(e && e.code === "ERR_MODULE_NOT_FOUND" && bare)) throw e;
    for (const dir of NODE_PATH) {
      try {
        return await next(specifier, { ...context, parentURL: pathToFileURL(path.join(dir, "<importer>")).href });
      } catch { /* not in this one */ }
    }
    const require = requireFrom();
    if (require) {
      try {
        return { url: pathToFileURL(require.resolve(specifier)).href, shortCircuit: true };
      } catch { /* not on NODE_PATH either: Node's own error says what was looked for */ }
    }
    throw e;
  }
}

export async function load(url, context, next) {
  if (url === ENTRY) return { format: "module", source: state.code, shortCircuit: true };
  return next(url, context);
}
