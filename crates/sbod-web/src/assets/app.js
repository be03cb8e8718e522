// sbod dashboard: the pool view, live I/O charts, background progress and actions.
// Plain JavaScript with no library and nothing fetched from elsewhere: it works offline.
"use strict";

const POLL_MS = 2000;
const HISTORY = 60;
const history = {}; // array name -> [{t, reads, writes, rbytes, wbytes, lat}]
let lastMetrics = {}; // array name -> previous IoMetrics sample

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

function human(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return i === 0 ? `${b} B` : `${b.toFixed(1)} ${u[i]}`;
}

function secs(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return `${s.toFixed(0)}s`;
  if (s < 3600) return `${(s / 60).toFixed(0)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}

function latency(s) {
  if (s < 1e-3) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1e3).toFixed(1)} ms`;
  return `${s.toFixed(2)} s`;
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function act(array, action, body) {
  const token = $("token").value.trim();
  if (!token) throw new Error("give the API token first (sbod web --print-token)");
  const r = await fetch(`/api/v1/arrays/${encodeURIComponent(array)}/${action}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify(body || {}),
  });
  const j = await r.json();
  if (!r.ok) throw new Error(j.error || r.statusText);
  return j.result;
}

// Ask before acting, saying what will happen; `fields` are inputs the action needs.
function confirmAction(title, text, fields) {
  return new Promise((resolve) => {
    const d = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    const box = $("confirm-fields");
    box.replaceChildren();
    const inputs = {};
    for (const f of fields || []) {
      inputs[f.name] = el("input", { value: f.value || "", placeholder: f.placeholder || "" });
      box.append(el("label", {}, f.label, inputs[f.name]));
    }
    d.onclose = () => {
      if (d.returnValue !== "ok") return resolve(null);
      const out = {};
      for (const [k, i] of Object.entries(inputs)) out[k] = i.value.trim();
      resolve(out);
    };
    d.returnValue = "";
    d.showModal();
  });
}

async function run(array, action, title, text, fields, makeBody) {
  const got = await confirmAction(title, text, fields);
  if (got === null) return;
  try {
    await act(array, action, makeBody ? makeBody(got) : {});
    showError(null);
  } catch (e) {
    showError(`${action} on ${array}: ${e.message}`);
  }
  refresh();
}

function showError(msg) {
  const e = $("error");
  e.hidden = !msg;
  e.textContent = msg || "";
}

function memberName(m) {
  return m.path || m.uuid || `slot ${m.slot}`;
}

// A member's disk: where it sits and its stable name, beside the /dev name.
function diskLine(m) {
  const parts = [];
  const l = m.location, id = m.identity;
  if (l) parts.push(l.enclosure === "pci" ? `PCIe slot ${l.slot}` : `enclosure ${l.enclosure} slot ${l.slot}`);
  if (id) {
    if (id.kernel_name) parts.push(id.kernel_name);
    if (id.wwn) parts.push(`wwn ${id.wwn}`);
    else if (id.serial) parts.push(`serial ${id.serial}`);
    if (id.actuators) parts.push(`${id.actuators} actuators`);
    if (id.shared_drive) parts.push("dual-actuator drive shared with another member");
  }
  return parts.join(", ");
}

// The health badge: ok / warn / failing, or n/a with the reason (files, remote members,
// disks without SMART); the reasons and counters in its tooltip.
function healthCell(m) {
  const h = m.health;
  if (!h) return el("td", {}, "–");
  const word = h.verdict === "unavailable" ? "n/a" : h.verdict;
  const bits = [];
  if (h.temperature_celsius !== undefined) bits.push(`${h.temperature_celsius} °C`);
  if (h.percentage_used !== undefined) bits.push(`${h.percentage_used}% used`);
  const why = (h.verdict === "unavailable" ? "not available: " : "") + (h.reasons || []).join("; ");
  return el("td", { class: "health", title: why },
    el("span", { class: `badge health-${h.verdict}` }, word),
    bits.length ? el("span", { class: "muted-dark" }, " " + bits.join(", ")) : null,
    h.verdict === "warn" || h.verdict === "failing" ? el("div", { class: "muted-dark" }, why) : null);
}

function memberActions(s, m) {
  const name = memberName(m);
  const b = [];
  if (m.location && m.location.led) {
    b.push(el("button", {
      onclick: () => run(s.name, "locate", `Light the locate LED of ${name}?`,
        `The locate LED of ${diskLine(m)} blinks so that the disk can be found in the rack. ` +
        `Nothing else changes; put it out again with the same button's "off".`,
        [{ name: "off", label: "Type 'off' to put it out instead (optional)" }],
        (f) => ({ member: name, off: f.off === "off" })),
    }, "locate"));
  }
  // Failures the member's group can still take after this one.
  const lost = s.members.filter((x) => x.group === m.group && x.slot !== null &&
    !["active", "replacing"].includes(x.state)).length;
  const left = s.redundancy - lost - 1;
  if (["active", "rebuilding", "spare", "replacing"].includes(m.state)) {
    b.push(el("button", {
      class: "danger",
      onclick: () => run(s.name, "fail", `Fail ${name}?`,
        m.state === "spare" || m.state === "replacing"
          ? `${name} leaves service; ${s.name} keeps running as it is.`
          : left < 0
            ? `${name} is taken out of service. Group ${m.group} has no redundancy left: ` +
              `${s.name} FAILS and its data becomes unavailable to clients.`
            : `${name} is taken out of service. ${s.name} runs degraded: group ${m.group} then survives ` +
              `${left} more failure(s) until a spare or a replacement is rebuilt. ` +
              `Clients keep their data; reads of its chunks are reconstructed.`,
        [], () => ({ member: name })),
    }, "fail"));
  }
  if (["failed", "spare"].includes(m.state)) {
    b.push(el("button", {
      onclick: () => run(s.name, "remove", `Remove ${name}?`,
        `${name} is removed from ${s.name}'s records; the device itself is left as it is.`,
        [], () => ({ member: name })),
    }, "remove"));
  }
  if (["active", "failed", "missing"].includes(m.state) && m.slot !== null) {
    b.push(el("button", {
      onclick: () => run(s.name, "replace", `Replace ${name}?`,
        `A new member is rebuilt from the others to take slot ${m.slot} over from ${name}. ` +
        `The rebuild runs online, its progress shown here; ${name} leaves when it is done.`,
        [{ name: "new", label: "New member (path)", placeholder: "/dev/sdX or /path/file.img" },
         { name: "size", label: "Create a file of this size if missing (optional)", placeholder: "e.g. 1G" }],
        (f) => ({ old: name, new: f.new, ...(f.size ? { size: f.size } : {}) })),
    }, "replace"));
  }
  return b;
}

function arrayActions(s) {
  return el("div", { class: "actions" },
    el("button", {
      onclick: () => run(s.name, "scrub", `Check ${s.name}?`,
        `Every stripe's parity and mirrors are read and compared, online, at the background rate. ` +
        `Nothing is changed; mismatches are reported.`, [], () => ({ repair: false })),
    }, "check"),
    el("button", {
      onclick: () => run(s.name, "scrub", `Repair ${s.name}?`,
        `Every stripe is checked and what is found wrong is rewritten` +
        (s.redundancy >= 2 ? " (a single bad chunk is located from two or more parity)." : " (parity is recomputed from the data)."),
        [], () => ({ repair: true })),
    }, "repair"),
    el("button", {
      onclick: () => run(s.name, "add", `Add a hot spare to ${s.name}?`,
        s.state === "degraded"
          ? `${s.name} is degraded: the new spare starts rebuilding at once.`
          : `The new member waits as a hot spare and takes over when a member fails.`,
        [{ name: "member", label: "Member (path)", placeholder: "/dev/sdX or /path/file.img" },
         { name: "domain", label: "Failure domain (optional)" },
         { name: "size", label: "Create a file of this size if missing (optional)", placeholder: "e.g. 1G" }],
        (f) => ({ members: [f.member], domain: f.domain, ...(f.size ? { size: f.size } : {}) })),
    }, "add spare"),
    el("button", {
      onclick: () => run(s.name, "grow", `Grow ${s.name}?`, growText(s),
        [{ name: "members", label: "New members (paths, separated by spaces)", placeholder: "/dev/sdX /dev/sdY or /path/d8.img" },
         { name: "size", label: "Create files of this size if missing (optional)", placeholder: "e.g. 1G" },
         { name: "new_groups", label: "Type 'groups' to add whole groups rather than widen each (optional)" },
         { name: "level", label: "New level, one member per group (optional: raid0 -> raid5, raid5 -> raid6, ec:K+M -> ec:K+(M+1))" }],
        (f) => ({ add: f.members.split(/\s+/).filter((x) => x), ...(f.size ? { size: f.size } : {}),
          ...(f.level ? { level: f.level } : {}), new_groups: f.new_groups === "groups" })),
    }, "grow"),
    el("button", {
      onclick: () => run(s.name, "grow", `Remove members from ${s.name}?`,
        `The data is restriped onto the other members while ${s.name} serves, and the volume shrinks at once ` +
        `to what they hold (refused while it holds data past that size). Members that can leave: the last of every group.`,
        [{ name: "members", label: "Members to let go (paths, separated by spaces)", placeholder: "/dev/sdX or /path/d7.img" }],
        (f) => ({ remove: f.members.split(/\s+/).filter((x) => x) })),
    }, "remove members"),
    el("button", {
      onclick: () => run(s.name, "grow", `New chunk for ${s.name}?`,
        `The data is restriped onto the same members with the new chunk while ${s.name} serves. ` +
        `Every window is first written aside in the members' last rows, so the volume's last part ` +
        `(64 MiB of every member, a quarter of a small one) is out of it until the data has moved, and comes back as zeros ` +
        `(refused while it holds data). It moves every byte twice: expect about twice a rebuild's time.`,
        [{ name: "chunk", label: "New chunk (a power of two, 4K to 16M)", placeholder: "e.g. 128K" }],
        (f) => ({ chunk: f.chunk })),
    }, "new chunk"),
    el("button", {
      onclick: () => run(s.name, "set", `Rebuild rates of ${s.name}`,
        `Background work (rebuild, scrub, resync) runs at least at the floor while clients are busy, ` +
        `and at most at the ceiling. 0 means no floor / no ceiling.`,
        [{ name: "min", label: "Floor (bytes/s, e.g. 50M)" }, { name: "max", label: "Ceiling (bytes/s, e.g. 1G)" }],
        (f) => ({ ...(f.min ? { rebuild_min_rate: f.min } : {}), ...(f.max ? { rebuild_max_rate: f.max } : {}) })),
    }, "rates"),
    el("button", {
      class: "danger",
      onclick: () => run(s.name, "stop", `Stop serving ${s.name}?`,
        `NBD clients are disconnected, writes are flushed and the members are marked clean. ` +
        `Start it again with sbod serve ${s.name} (or systemctl start sbod@${s.name}).`, [], () => ({})),
    }, "stop"),
  );
}

// What a grow will do to an array, and about how long it takes: a reshape reads and
// rewrites every member once (its time is about a rebuild's of one member at the rate
// background work reached last here).
function growText(s) {
  if (s.level === "concat") return `The new members are appended: ${s.name} grows at once; no data moves.`;
  if (s.level === "raid1") return `Each new member becomes one more copy, rebuilt online from the others while they serve.`;
  const per = s.size / Math.max(1, (s.width - s.redundancy) * s.groups);
  const rate = s.last_process && s.last_process.rate > 0 ? s.last_process.rate : 0;
  const eta = rate ? `about ${secs(per / rate)} at ${human(rate)}/s (the rate the last background process reached here)` :
    `about as long as a rebuild of one member (${human(per)} on each member is read and rewritten)`;
  return `Every byte of the ${human(s.size)} volume moves into the wider layout, online, while clients read and write; ` +
    `the new capacity appears when it has moved: ${eta}. It resumes after a stop or a crash. ` +
    `Rebuilds and scrubs wait for it. The array must be optimal and have no log device.`;
}

function progress(p, label) {
  if (!p) return null;
  const pct = Math.min(100, Math.max(0, p.percent || 0));
  return el("div", { class: "progress", "data-process": p.kind },
    el("div", {}, `${label} ${p.kind}: ${pct.toFixed(1)}% (${human(p.done)} of ${human(p.total)}) at ${human(p.rate)}/s`,
      p.eta_secs ? `, ${secs(p.eta_secs)} left` : "", p.mismatches ? `, ${p.mismatches} mismatched block(s)` : ""),
    el("div", { class: "bar" }, el("div", { style: `width:${pct}%` })));
}

function chart(name, key, label, fmt) {
  const c = el("canvas", { width: 300, height: 80 });
  const h = history[name] || [];
  const vals = h.map((x) => x[key]);
  const last = vals.length ? vals[vals.length - 1] : null;
  requestAnimationFrame(() => draw(c, vals));
  return el("div", { class: "chart", "data-chart": key },
    el("div", { class: "label" }, el("span", {}, label), el("span", {}, last === null ? "–" : fmt(last))), c);
}

function draw(c, vals) {
  const g = c.getContext("2d");
  const w = c.width, h = c.height;
  g.clearRect(0, 0, w, h);
  if (vals.length < 2) return;
  const max = Math.max(...vals, 1e-9);
  g.strokeStyle = "#1f5fbf";
  g.lineWidth = 2;
  g.beginPath();
  vals.forEach((v, i) => {
    const x = (i / (HISTORY - 1)) * w;
    const y = h - 4 - (v / max) * (h - 8);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
}

function layout(s) {
  if (s.level === "raid10") return `raid10, ${s.groups} mirror sets of ${s.width}`;
  if (s.level === "concat") return "concat";
  return s.groups > 1 ? `${s.level} in ${s.groups} groups of ${s.width}` : `${s.level} of ${s.width}`;
}

function arrayCard(s) {
  const rows = [];
  let group = null;
  for (const m of s.members) {
    if (m.group !== group) {
      group = m.group;
      rows.push(el("tr", { class: "group-head" }, el("td", { colSpan: 10 },
        group === null ? "spares" : `group ${group}`)));
    }
    let state = m.state;
    if (m.recovered !== null && m.size > 0) state += ` ${(100 * m.recovered / m.size).toFixed(0)}%`;
    rows.push(el("tr", { class: "member", "data-member": memberName(m), "data-state": m.state,
      "data-health": m.health ? m.health.verdict : "" },
      el("td", {}, m.slot === null ? "–" : m.slot),
      el("td", { class: "path" }, memberName(m),
        diskLine(m) ? el("div", { class: "muted-dark disk" }, diskLine(m)) : null),
      el("td", {}, el("span", { class: `badge state-${m.state}` }, state)),
      el("td", {}, m.domain || "–"),
      el("td", { class: "num" }, m.size ? human(m.size) : "–"),
      el("td", { class: "num" + (m.read_errors ? " errs" : "") }, m.read_errors),
      el("td", { class: "num" + (m.write_errors ? " errs" : "") }, m.write_errors),
      el("td", { class: "num" + (m.checksum_errors ? " errs" : "") }, m.checksum_errors),
      healthCell(m),
      el("td", {}, memberActions(s, m)),
    ));
  }
  const last = s.last_process;
  return el("article", { class: "array", "data-array": s.name, "data-state": s.state },
    el("h2", {}, s.name, el("span", { class: `badge state-${s.state} array-state` }, s.state),
      s.running ? el("span", { class: "muted" }, "served") : el("span", { class: "muted" }, "not served")),
    el("div", { class: "summary" }, `${layout(s)}, chunk ${human(s.chunk)}, ${human(s.size)} usable, survives ` +
      `${s.redundancy} failure(s) per group`),
    s.failed_reason ? el("p", { class: "error" }, s.failed_reason) : null,
    progress(s.process, "running:"),
    last && !s.process ? el("div", { class: "muted-dark" },
      `last ${last.kind}: ${last.error ? "stopped: " + last.error : "done"} in ${secs(last.elapsed_secs)}` +
      ((last.kind === "check" || last.kind === "repair") ? `, ${last.mismatches} mismatched block(s)` : "")) : null,
    s.running ? el("div", { class: "charts" },
      chart(s.name, "iops", "IOPS (read+write)", (v) => v.toFixed(0)),
      chart(s.name, "bw", "bandwidth", (v) => `${human(v)}/s`),
      chart(s.name, "lat", "mean latency", latency)) : null,
    el("table", {},
      el("thead", {}, el("tr", {}, ["slot", "member", "state", "domain", "size", "read err", "write err", "cksum err", "health", ""]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)),
    arrayActions(s));
}

// Turn two metric samples into rates for the charts.
function sample(name, m) {
  const prev = lastMetrics[name];
  lastMetrics[name] = m;
  if (!prev || m.uptime_secs <= prev.uptime_secs) return;
  const dt = m.uptime_secs - prev.uptime_secs;
  const ops = (m.reads - prev.reads) + (m.writes - prev.writes);
  const bytes = (m.read_bytes - prev.read_bytes) + (m.write_bytes - prev.write_bytes);
  let n = 0, sum = 0;
  for (const h of m.latency) {
    const p = prev.latency.find((x) => x.op === h.op);
    if (!p || h.op === "flush") continue;
    n += h.counts.reduce((a, b) => a + b, 0) - p.counts.reduce((a, b) => a + b, 0);
    sum += h.sum_secs - p.sum_secs;
  }
  const h = (history[name] = history[name] || []);
  h.push({ iops: ops / dt, bw: bytes / dt, lat: n ? sum / n : 0 });
  while (h.length > HISTORY) h.shift();
}

function renderEvents(evs) {
  const sev = { member_failed: "warn", array_degraded: "warn", scrub_mismatches: "warn", array_failed: "bad",
    member_health: "warn", proactive_replace: "warn",
    array_optimal: "ok", rebuild_finished: "ok", scrub_finished: "ok", reshape_finished: "ok" };
  $("events").replaceChildren(...evs.slice().reverse().map((e) =>
    el("li", { class: `sev-${sev[e.event] || "info"}`, "data-event": e.event },
      el("div", { class: "muted-dark" }, new Date(e.time * 1000).toLocaleTimeString()), e.message)));
}

async function refresh() {
  try {
    const arrays = await get("/api/v1/arrays");
    await Promise.all(arrays.filter((s) => s.running).map(async (s) => {
      try { sample(s.name, await get(`/api/v1/arrays/${encodeURIComponent(s.name)}/metrics`)); } catch (e) { /* stopping */ }
    }));
    $("arrays").replaceChildren(...(arrays.length ? arrays.map(arrayCard)
      : [el("p", {}, "No arrays registered. Create one with sbod create, or assemble one with sbod assemble --scan.")]));
    renderEvents(await get("/api/v1/events"));
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if ($("error").textContent.startsWith("cannot reach")) showError(null);
  } catch (e) {
    showError(`cannot reach the sbod web service: ${e.message}`);
  }
}

$("token").value = localStorage.getItem("sbod-token") || "";
$("token").addEventListener("change", () => localStorage.setItem("sbod-token", $("token").value.trim()));
refresh();
setInterval(refresh, POLL_MS);
