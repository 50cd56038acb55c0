// Console shell: sign-in with an admin token, hash routing between the four pages.
import { api, auth } from "./api.js";
import { clear, describeError, h, notice } from "./dom.js";
import * as providers from "./providers.js";
import * as playground from "./playground.js";
import * as sessions from "./sessions.js";
import * as tokens from "./tokens.js";
import * as egress from "./egress.js";
import * as runtimes from "./runtimes.js";

const PAGES = { providers, playground, sessions, tokens, egress, runtimes };
const TITLES = { providers: "Providers", playground: "Playground", sessions: "Sessions", tokens: "Tokens", egress: "Egress", runtimes: "Runtimes" };

const main = () => document.getElementById("main");
let signedIn = null;

function showChrome(who) {
  document.getElementById("nav").hidden = !who;
  document.getElementById("logout").hidden = !who;
  const label = document.getElementById("who");
  label.hidden = !who;
  label.textContent = who ? `tenant ${who.tenant_id} · ${who.role}` : "";
}

function loginPage(message) {
  showChrome(null);
  signedIn = null;
  document.title = "Sign in · execbox console";
  const input = h("input", { id: "token", name: "token", type: "password", required: true,
    autocomplete: "off", spellcheck: "false", "aria-describedby": "token-help" });
  const status = h("div", { "aria-live": "polite" }, message ? notice("error", message) : null);
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h("form", { class: "card login", novalidate: true, onsubmit: async (ev) => {
    ev.preventDefault();
    const token = input.value.trim();
    if (!token) { clear(status, notice("error", "Enter an admin token.")); input.focus(); return; }
    button.disabled = true;
    try {
      const who = await api("GET", "/v1/sandbox/whoami", undefined, { token });
      if (who.role !== "admin") {
        clear(status, notice("error", `That token belongs to tenant "${who.tenant_id}" with role ${who.role}; the console needs an admin token.`));
        return;
      }
      auth.set(token);
      input.value = "";
      signedIn = who;
      route();
    } catch (err) {
      clear(status, notice("error", `Sign-in failed: ${describeError(err)}`));
      input.select();
    } finally {
      button.disabled = false;
    }
  } },
  h("h1", {}, "Sign in to the execbox console"),
  h("label", { for: "token" }, "Admin token"),
  input,
  h("small", { id: "token-help", class: "help" },
    "Printed by `execbox serve` on first start, or made with `execbox token create --tenant T --admin`. ",
    "It is kept in this tab only (session storage) and cleared when you sign out or close the tab."),
  status, button);
  clear(main(), form);
  input.focus();
}

async function route() {
  if (!auth.get()) return loginPage();
  if (!signedIn) {
    try {
      signedIn = await api("GET", "/v1/sandbox/whoami");
    } catch (err) {
      auth.clear();
      return loginPage(`Your saved token was not accepted: ${describeError(err)}`);
    }
    if (signedIn.role !== "admin") {
      auth.clear();
      return loginPage("That token is not an admin token.");
    }
  }
  showChrome(signedIn);
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1];
  const page = PAGES[name] ? name : "providers";
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${TITLES[page]} · execbox console`;
  const root = h("section", { class: "page", "aria-labelledby": "page-title" },
    h("h1", { id: "page-title" }, TITLES[page]));
  clear(main(), root);
  try {
    await PAGES[page].render(root);
  } catch (err) {
    root.append(notice("error", `This page could not load: ${describeError(err)}`));
  }
}

auth.onRejected = (err) => {
  auth.clear();
  loginPage(`The server rejected your token (${err.message}). Sign in again.`);
};

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("logout").addEventListener("click", () => {
    auth.clear();
    signedIn = null;
    location.hash = "";
    loginPage();
  });
  window.addEventListener("hashchange", () => { route(); main().focus({ preventScroll: true }); });
  route();
});
