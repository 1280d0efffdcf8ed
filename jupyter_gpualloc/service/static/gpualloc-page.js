// The allocator's page: every GPU and slice, the queue and usage, read from the REST API with fetch().
// It shows what the API shows its caller: an admin sees every user and gets the actions (each behind a
// confirmation); anyone else sees their own slices, queue and usage only. No data is put in the page
// as HTML: every text goes in through textContent.

const settings = document.body.dataset;
const API = settings.api; // <prefix>api/v1/
const HUB = settings.auth === "hub";
const TOKEN_KEY = "gpualloc-token";
const REFRESH_MS = 5000;
const MIB_PER_GIB = 1024;

class Unauthorized extends Error {}

// ------------------------------------------------------------------ the API

function requestHeaders() {
  const headers = { Accept: "application/json" };
  if (HUB) {
    headers["X-XSRFToken"] = settings.xsrf; // JupyterHub's check on cookie-authenticated calls
  } else {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
  }
  return headers;
}

async function call(method, path) {
  const reply = await fetch(API + path, {
    method, headers: requestHeaders(), credentials: "same-origin", cache: "no-store",
  });
  let data = null;
  try {
    data = await reply.json();
  } catch {
    data = null;
  }
  const message = data && data.error ? data.error : `${method} ${path}: HTTP ${reply.status}`;
  if (reply.status === 401) throw new Unauthorized(message);
  if (!reply.ok) throw new Error(message);
  return data;
}

function windowStart(choice, now) {
  if (choice === "month") {
    const today = new Date(now * 1000);
    return new Date(today.getFullYear(), today.getMonth(), 1).getTime() / 1000;
  }
  return now - Number(choice) * 86400;
}

async function load(windowChoice) {
  const now = Date.now() / 1000;
  const me = await call("GET", "user");
  const all = me.admin ? "?all=1" : "";
  const since = Math.floor(windowStart(windowChoice, now));
  const [inventory, leases, jobs, usage, efficiency] = await Promise.all([
    call("GET", "inventory"), call("GET", `leases${all}`), call("GET", `jobs${all}`),
    call("GET", `usage?by=user&since=${since}`), call("GET", `usage/efficiency?since=${since}`),
  ]);
  return {
    me, now, since, inventory, leases: leases.leases, usage,
    jobs: new Map(jobs.jobs.map((job) => [job.id, job])),
    efficiency: new Map(efficiency.rows.map((row) => [row.lease_id, row])),
  };
}

// ------------------------------------------------------------------ words

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function gib(mib) {
  const value = mib / MIB_PER_GIB;
  return `${Number.isInteger(value) ? value : value.toFixed(1)} GiB`;
}

/** GPU-hours as a person reads them: 12.5, 0.42, 0.0017 (two significant digits below 0.01), 0. */
function hours(value) {
  if (value === 0) return "0";
  if (value >= 10) return value.toFixed(1);
  return value >= 0.01 ? value.toFixed(2) : value.toPrecision(2);
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const minutes = Math.floor(s / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

function localTime(epoch) {
  return new Date(epoch * 1000).toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
}

function timeCell(epoch) {
  return epoch ? el("time", { datetime: new Date(epoch * 1000).toISOString() }, localTime(epoch)) : "—";
}

/** 'default server', 'server gpu2', 'job "train"', 'kernel 1a2b3c4d'; the raw holder is its tooltip. */
function holderName(holder, jobs) {
  const [kind, ...rest] = holder.split(":");
  const name = rest.join(":");
  if (kind === "server") return name ? `server ${name}` : "default server";
  if (kind === "job") {
    const job = jobs.get(name);
    return job ? `job "${job.name}"` : `job ${name.slice(0, 8)}`;
  }
  if (kind === "kernel") return `kernel ${name.slice(0, 8)}`;
  return holder;
}

function holderCell(lease, jobs) {
  const text = holderName(lease.holder, jobs);
  const pod = lease.pod ? ` (pod in ${lease.pod.namespace})` : "";
  return el("span", { title: lease.holder }, text + pod);
}

function describeSpec(spec) {
  const model = spec.model ? ` on ${spec.model}` : "";
  if (spec.profile) return `${spec.profile} slice${model}`;
  if (spec.kind === "whole") return (spec.count > 1 ? `${spec.count} whole GPUs` : "whole GPU") + model;
  const memory = spec.memory_gib ? `${spec.memory_gib} GiB` : "";
  if (spec.kind === "shared") return `shared ${memory} slice${model}`.replace("  ", " ");
  return memory ? `${memory} GPU slice${model}` : `any GPU slice${model}`;
}

function describeSlice(held, lease) {
  if (held.profile) return `${held.profile} (MIG)`;
  if (held.kind === "whole") {
    const count = lease && lease.slice ? lease.slice.gpu_uuids.length : 1;
    return count > 1 ? `whole (1 of ${count} GPUs)` : "whole GPU";
  }
  return `shared ${gib(held.memory_mib)}`;
}

function idleCell(lease, now) {
  if (lease.busy) return "busy now";
  const since = lease.last_activity ?? lease.granted_at;
  if (!since) return "—";
  const text = duration(now - since);
  return lease.idle_warned_at ? `${text} (warned ${localTime(lease.idle_warned_at)})` : text;
}

function utilisationCell(lease, efficiency) {
  const row = efficiency.get(lease.id);
  if (!row) return el("span", { class: "muted" }, "not measured");
  return el("span", { title: `${hours(row.busy_gpu_hours)} of ${hours(row.gpu_hours)} GPU-hours held were busy` },
    `${Math.round(row.efficiency * 100)}% busy`);
}

// ------------------------------------------------------------------ actions

function action(label, { method, path, confirm, done }) {
  return el("button", { type: "button", class: "action", dataset: { method, path, confirm, done } }, label);
}

function leaseAction(lease, jobs, what) {
  const jobId = lease.holder.startsWith("job:") ? lease.holder.slice(4) : null;
  const who = `${lease.user}'s ${holderName(lease.holder, jobs)}`;
  if (jobId) {
    return action("Cancel job", {
      method: "DELETE", path: `jobs/${encodeURIComponent(jobId)}`,
      confirm: `Cancel ${who}? It stops, and its slice goes back to the pool.`, done: `Cancelled ${who}.`,
    });
  }
  const queued = lease.state === "queued";
  return action(queued ? "Withdraw" : "Release", {
    method: "DELETE", path: `leases/${encodeURIComponent(lease.id)}`,
    confirm: queued ? `Withdraw ${who}'s request for ${describeSpec(lease.spec)}?`
      : `Release ${who}'s ${what}? Its holder loses the GPU.`,
    done: queued ? `Withdrew ${who}'s request.` : `Released ${who}'s ${what}.`,
  });
}

function drainAction(gpu, node) {
  const name = `GPU ${gpu.index} (${gpu.model}) on ${node.name}`;
  if (gpu.drained) {
    return action("Undrain", {
      method: "DELETE", path: `gpus/${encodeURIComponent(gpu.uuid)}/drain`,
      confirm: `Undrain ${name}? New slices may be placed on it again.`, done: `Undrained ${name}.`,
    });
  }
  return action("Drain", {
    method: "POST", path: `gpus/${encodeURIComponent(gpu.uuid)}/drain`,
    confirm: `Drain ${name}? No new slice is placed on it; the slices on it keep running until they end.`,
    done: `Drained ${name}.`,
  });
}

// ------------------------------------------------------------------ the page

function table(headings, rows, empty) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, headings.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows));
}

function heldEntries(gpu) {
  return [...(gpu.instances || []), ...(gpu.shares || [])].filter((held) => held.lease_id || held.outside);
}

function gpuSummary(gpu) {
  const states = [];
  if (gpu.drained) states.push(el("span", { class: "badge drained" }, "drained"));
  if (gpu.cordoned) states.push(el("span", { class: "badge" }, "cordoned"));
  let free;
  if (gpu.instances) {
    const profiles = Object.entries(gpu.free_profiles || {}).filter(([, n]) => n > 0);
    free = profiles.length ? `free: ${profiles.map(([name, n]) => `${n} × ${name}`).join(", ")}` : "no free slice";
  } else {
    free = gpu.whole_free ? "free" : gpu.free_memory_mib > 0 ? `free: ${gib(gpu.free_memory_mib)}` : "full";
  }
  return [states, el("span", { class: "free" }, free)];
}

function renderGpus(state) {
  const { me, now, inventory, jobs, efficiency } = state;
  const leases = new Map(state.leases.map((lease) => [lease.id, lease]));
  const headings = ["Slice", "User", "Holder", "Since", "Idle for", "Memory", "Utilisation"];
  if (me.admin) headings.push("");
  const cards = [];
  for (const node of inventory.nodes) {
    for (const gpu of node.gpus) {
      const rows = [];
      let others = 0;
      for (const held of heldEntries(gpu)) {
        const lease = leases.get(held.lease_id);
        const what = describeSlice(held, lease);
        if (held.outside && me.admin) {
          rows.push(el("tr", { class: "outside" }, el("td", {}, what),
            el("td", { colspan: headings.length - 1 }, `outside the allocator: ${held.outside}`)));
        } else if (lease && lease.state === "granted") {
          rows.push(el("tr", { dataset: { lease: lease.id } },
            el("td", {}, what), el("td", {}, lease.user), el("td", {}, holderCell(lease, jobs)),
            el("td", {}, timeCell(lease.granted_at)), el("td", {}, idleCell(lease, now)),
            el("td", {}, `${gib(held.memory_mib ?? lease.slice.memory_mib)} of ${gib(gpu.memory_mib)}`),
            el("td", {}, utilisationCell(lease, efficiency)),
            me.admin ? el("td", {}, leaseAction(lease, jobs, what)) : null));
        } else if (held.user && held.holder) {
          // a lease that ended, whose slice waits for its holder to be gone (visible to its user and admins)
          rows.push(el("tr", { class: "returning" }, el("td", {}, what), el("td", {}, held.user),
            el("td", {}, el("span", { title: held.holder }, holderName(held.holder, jobs))),
            el("td", { colspan: headings.length - 3 }, "ended; the slice returns once its holder is gone")));
        } else {
          others += 1;
        }
      }
      const title = el("h3", {}, `GPU ${gpu.index} · ${gpu.model} · ${gib(gpu.memory_mib)} · ${node.name}`);
      cards.push(el("article", { class: "gpu", dataset: { gpu: gpu.uuid } },
        el("div", { class: "gpu-head" }, title, gpuSummary(gpu), me.admin ? drainAction(gpu, node) : null),
        rows.length ? table(headings, rows, "") : null,
        others ? el("p", { class: "muted" }, `${others} slice${others > 1 ? "s" : ""} held by other users`) : null,
        !rows.length && !others ? el("p", { class: "empty" }, "No slice is held on this GPU.") : null));
    }
  }
  document.getElementById("gpu-list").replaceChildren(...cards);
}

function renderQueue(state) {
  const { me, now, jobs } = state;
  const queued = state.leases.filter((lease) => lease.state === "queued")
    .sort((a, b) => (a.position ?? Infinity) - (b.position ?? Infinity));
  const headings = ["Position", "User", "Holder", "Asks for", "Waiting since", "Why it waits"];
  if (me.admin) headings.push("");
  const rows = queued.map((lease) => el("tr", { dataset: { lease: lease.id } },
    el("td", {}, lease.position ?? "—"), el("td", {}, lease.user), el("td", {}, holderCell(lease, jobs)),
    el("td", {}, describeSpec(lease.spec)),
    el("td", {}, timeCell(lease.created_at), ` (${duration(now - lease.created_at)})`),
    el("td", { class: "reason" }, lease.reason || "—"),
    me.admin ? el("td", {}, leaseAction(lease, jobs, describeSpec(lease.spec))) : null));
  document.getElementById("queue-list").replaceChildren(table(headings, rows, "Nobody is waiting."));
}

function renderUsage(state) {
  const { me, usage, since } = state;
  const rows = usage.rows;
  const most = Math.max(...rows.map((row) => row.gpu_hours), 0);
  const body = rows.map((row) => el("tr", {},
    el("td", {}, row.user), el("td", {}, hours(row.gpu_hours)),
    el("td", {}, el("meter", { min: 0, max: most || 1, value: row.gpu_hours, title: `${row.gpu_hours} GPU-hours` })),
    el("td", {}, hours(row.gib_hours)), el("td", {}, row.leases)));
  const parts = [el("p", { class: "muted" }, `Since ${localTime(since)}: ${hours(usage.total.gpu_hours)} GPU-hours `
    + `in all${me.admin ? "" : " (yours)"}.`),
  table(["User", "GPU-hours", "", "GiB-hours", "Leases"], body, "No GPU was used in this window.")];
  if (!me.admin) parts.push(...usage.quotas.map((quota) => el("p", { class: "quota" }, quota.message)));
  document.getElementById("usage-list").replaceChildren(...parts);
}

function render(state) {
  const { me } = state;
  document.getElementById("who").replaceChildren(me.user, " ",
    el("span", { class: me.admin ? "badge admin" : "badge" }, me.admin ? "admin: every user" : "your slices only"));
  renderGpus(state);
  renderQueue(state);
  renderUsage(state);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  document.getElementById("content").hidden = false;
}

// ------------------------------------------------------------------ wiring

const notice = document.getElementById("notice");
const tokenForm = document.getElementById("token-form");
const windowSelect = document.getElementById("window");
let timer = null;
let generation = 0; // the latest refresh: an older one still reading gives way to it
let readFailed = false; // the notice says the last read failed: the next good one clears it

function say(text, error = false) {
  notice.textContent = text;
  notice.classList.toggle("error", error);
  notice.hidden = !text;
}

function askForToken(message = "") {
  clearTimeout(timer);
  generation += 1;
  document.getElementById("content").hidden = true;
  document.getElementById("sign-out").hidden = true;
  document.getElementById("token-error").textContent = message;
  tokenForm.hidden = false;
  document.getElementById("token").focus();
}

async function refresh() {
  clearTimeout(timer);
  const mine = ++generation;
  try {
    const state = await load(windowSelect.value);
    if (mine !== generation) return;
    render(state);
    if (readFailed) say("");
    readFailed = false;
    if (!HUB) document.getElementById("sign-out").hidden = false;
  } catch (err) {
    if (mine !== generation) return;
    if (err instanceof Unauthorized) {
      if (HUB) say("Your login to this service has expired: reload the page to log in again.", true);
      else askForToken(sessionStorage.getItem(TOKEN_KEY) ? `That token was refused: ${err.message}` : "");
      return;
    }
    say(`Could not read the allocator: ${err.message}`, true);
    readFailed = true;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  tokenForm.hidden = true;
  refresh();
});

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  say("");
  askForToken();
});

windowSelect.addEventListener("change", refresh);

document.querySelector("main").addEventListener("click", async (event) => {
  const button = event.target.closest("button.action");
  if (!button) return;
  const { method, path, confirm: question, done } = button.dataset;
  if (!window.confirm(question)) return;
  button.disabled = true;
  try {
    await call(method, path);
    say(done);
  } catch (err) {
    say(err.message, true);
  }
  refresh();
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && tokenForm.hidden) refresh();
});

if (!HUB && !sessionStorage.getItem(TOKEN_KEY)) askForToken();
else refresh();
