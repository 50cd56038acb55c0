// A plain <textarea> code editor: monospace, Tab indents (Shift+Tab dedents), Escape releases
// the Tab key for one press so keyboard users can still move focus out of the editor.
const INDENT = "    ";

export function codeEditor(textarea, onRun) {
  let releaseTab = false;
  textarea.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") { releaseTab = true; return; }
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); onRun(); return; }
    if (ev.key !== "Tab" || ev.altKey || ev.ctrlKey || ev.metaKey) { releaseTab = false; return; }
    if (releaseTab) { releaseTab = false; return; }
    ev.preventDefault();
    const { selectionStart: start, selectionEnd: end, value } = textarea;
    const lineStart = value.lastIndexOf("\n", start - 1) + 1;
    if (!ev.shiftKey && start === end) {
      replace(textarea, start, end, INDENT, start + INDENT.length, start + INDENT.length);
      return;
    }
    const blockEnd = end > start && value[end - 1] === "\n" ? end - 1 : end;
    const lines = value.slice(lineStart, blockEnd).split("\n");
    let changed;
    if (ev.shiftKey) {
      changed = lines.map((l) => l.replace(/^( {1,4}|\t)/, ""));
    } else {
      changed = lines.map((l) => INDENT + l);
    }
    const text = changed.join("\n");
    const firstDelta = changed[0].length - lines[0].length;
    replace(textarea, lineStart, blockEnd, text,
      Math.max(lineStart, start + firstDelta), lineStart + text.length);
  });
  textarea.addEventListener("blur", () => { releaseTab = false; });
}

function replace(textarea, from, to, text, selStart, selEnd) {
  textarea.setSelectionRange(from, to);
  // execCommand keeps the browser's undo history; setRangeText is the fallback.
  if (!document.execCommand || !document.execCommand("insertText", false, text)) {
    textarea.setRangeText(text, from, to, "end");
  }
  textarea.setSelectionRange(selStart, selEnd);
}
