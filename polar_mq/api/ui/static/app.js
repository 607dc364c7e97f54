// polar_mq trajectory viewer: plain script, no build step. Reads /ui/api/* (same-origin cookie).
"use strict";

const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");

// --- small helpers ---------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path) {
  const resp = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (resp.status === 401) { location.reload(); throw new Error("signed out"); }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(body.detail || `${resp.status} ${resp.statusText}`);
  return body;
}

const fmt = {
  num(v, digits = 3) { return v === null || v === undefined ? "–" : Number(v).toPrecision(digits).replace(/\.?0+$/, ""); },
  secs(v) { return v === null || v === undefined ? "–" : (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " s"; },
  ms(v) { return v === null || v === undefined ? "–" : (v < 1000 ? Math.round(v) + " ms" : (v / 1000).toFixed(2) + " s"); },
  time(t) { return t ? new Date(t * 1000).toLocaleString() : "–"; },
  short(id) { return id && id.length > 22 ? "…" + id.slice(-18) : id; },
};

function badge(text, cls) { return el("span", { class: `badge st-${cls || text}` }, text); }
function kv(pairs) {
  return el("div", { class: "kv" }, pairs.filter(p => p).map(([k, v]) => el("span", {}, el("b", {}, k), v)));
}
function setCrumbs(...parts) {
  crumbs.replaceChildren(...parts.map(([label, href]) => href ? el("a", { href }, label) : el("span", {}, label)));
}
function mount(...nodes) { app.replaceChildren(...nodes.filter(n => n !== null && n !== undefined && n !== false)); }
function showError(err) {
  mount(el("p", { class: "error" }, String(err.message || err)));
  document.body.dataset.ready = "error";
}
function pretty(obj) { return JSON.stringify(obj, null, 2); }

function timelineBar(segments, big) {
  const total = segments.reduce((a, s) => a + s.seconds, 0) || 1;
  const bar = el("div", { class: "timeline" + (big ? " big" : "") });
  for (const s of segments) {
    if (!s.seconds && !["COMPLETED", "ERROR", "TIMEOUT"].includes(s.state)) continue;
    const width = s.seconds ? Math.max(0.5, (100 * s.seconds) / total) : 0.8;
    bar.append(el("div", { class: `tl-${s.state}`, style: `width:${width}%`,
                           title: `${s.state} ${fmt.secs(s.seconds)}${s.node ? " on " + s.node : ""}` },
                  big && width > 8 ? `${s.state} ${fmt.secs(s.seconds)}` : ""));
  }
  return bar;
}

function filterControls(states, onChange) {
  const search = el("input", { type: "search", placeholder: "search ids, errors, instructions…" });
  const select = el("select", {}, el("option", { value: "" }, "all states"),
                    states.map(s => el("option", { value: s }, s)));
  search.addEventListener("input", onChange);
  select.addEventListener("change", onChange);
  return { node: el("div", { class: "controls" }, search, select), search, select };
}

function matches(filters, state, haystack) {
  const q = filters.search.value.trim().toLowerCase();
  if (filters.select.value && filters.select.value !== state) return false;
  return !q || haystack.toLowerCase().includes(q);
}

// --- tasks -------------------------------------------------------------------------------------
async function tasksPage() {
  setCrumbs(["tasks"]);
  const data = await api("/ui/api/tasks?limit=500");
  const filters = filterControls(["pending", "running", "done"], render);
  const body = el("tbody");
  mount(el("h1", {}, "Tasks"), filters.node,
    el("table", { id: "tasks" }, el("thead", {}, el("tr", {},
      ["task", "state", "samples", "sessions by state", "mean reward", "harness", "policy", "created", "instruction"]
        .map(h => el("th", {}, h)))), body));
  function render() {
    body.replaceChildren(...data.tasks.filter(t => matches(filters, t.state,
        [t.task_id, t.instruction, t.harness, ...(t.session_ids || [])].join(" "))).map(t =>
      el("tr", { class: "clickable", dataset: { taskId: t.task_id }, onclick: () => { location.href = `/ui/tasks/${encodeURIComponent(t.task_id)}`; } },
        el("td", { class: "mono" }, el("a", { href: `/ui/tasks/${encodeURIComponent(t.task_id)}` }, t.task_id)),
        el("td", {}, badge(t.state), t.cancelled ? badge("cancelled", "ERROR") : null),
        el("td", { class: "num" }, t.num_samples),
        el("td", {}, Object.entries(t.counts || {}).map(([s, n]) => badge(`${s} ${n}`, s))),
        el("td", { class: "num" }, fmt.num(t.mean_reward)),
        el("td", {}, t.harness || "–"), el("td", {}, t.policy_version ?? "–"),
        el("td", {}, fmt.time(t.created_at)), el("td", { class: "muted" }, (t.instruction || "").slice(0, 90)))));
  }
  render();
  document.body.dataset.ready = "1";
}

// --- one task ------------------------------------------------------------------------------------
async function taskPage(taskId) {
  const t = await api(`/ui/api/tasks/${encodeURIComponent(taskId)}`);
  setCrumbs(["tasks", "/ui/"], [t.task_id]);
  const filters = filterControls(["REGISTERED", "INITIALIZING", "READY", "RUNNING", "POST_RUN", "BUILDING",
                                  "EVALUATING", "COMPLETED", "ERROR", "TIMEOUT"], render);
  const body = el("tbody");
  mount(
    el("h1", {}, "Task ", el("span", { class: "mono" }, t.task_id), " ", badge(t.state)),
    kv([["harness", t.harness || "–"], ["model", t.agent.model || "–"], ["builder", t.builder.strategy || "–"],
        ["grader", t.grader.strategy || "–"], ["samples", t.num_samples], ["mean reward", fmt.num(t.mean_reward)],
        ["policy version", t.policy_version ?? "–"], ["created", fmt.time(t.created_at)],
        ["dispatch priority", t.dispatch_priority ?? 0],
        ["early stopped", t.early_stopped ? `${t.early_stopped} session(s)` : "–"],
        ["group view", el("a", { href: `/ui/groups/${encodeURIComponent(t.task_id)}` }, "samples side by side")]]),
    el("p", { class: "muted" }, t.instruction),
    filters.node,
    el("table", { id: "sessions" }, el("thead", {}, el("tr", {},
      ["#", "session", "state", "reward", "stages", "attempt", "node", "policy", "error"].map(h => el("th", {}, h)))), body));
  function render() {
    body.replaceChildren(...t.sessions.filter(s => matches(filters, s.state,
        [s.session_id, s.error || "", s.node || ""].join(" "))).map(s =>
      el("tr", { class: "clickable", dataset: { sessionId: s.session_id }, onclick: () => { location.href = `/ui/sessions/${encodeURIComponent(s.session_id)}`; } },
        el("td", { class: "num" }, s.index),
        el("td", { class: "mono" }, el("a", { href: `/ui/sessions/${encodeURIComponent(s.session_id)}` }, s.session_id)),
        el("td", {}, badge(s.state)), el("td", { class: "num" }, fmt.num(s.reward)),
        el("td", {}, timelineBar(s.timeline, false)), el("td", { class: "num" }, s.attempt),
        el("td", { class: "mono" }, s.node || "–"), el("td", {}, s.policy_version ?? "–"),
        el("td", { class: "error" }, (s.error || "").slice(0, 200)))));
  }
  render();
  document.body.dataset.ready = "1";
  if (t.state !== "done") setTimeout(() => taskPage(taskId).catch(showError), 3000);
}

// --- one session -------------------------------------------------------------------------------
const SPECIAL = /^<\|.*\|>$|^<\/?s>$|^\[.*\]$/;

function tokenText(texts, id) {
  const t = texts[String(id)];
  if (t === undefined || t === null || t === "") return { text: `⟨${id}⟩`, special: true };
  return { text: t.replace(/\n/g, "↵\n"), special: SPECIAL.test(t) };
}

function heat(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)}, 85%, ${Math.round(78 + 8 * p)}%)`;
}

function tokenSpan(texts, id, mask, part, logprob) {
  const { text, special } = tokenText(texts, id);
  const span = document.createElement("span");
  span.className = `tok m${mask} ${part}${special ? " special" : ""}`;
  span.dataset.tokenId = String(id);
  span.dataset.lossMask = String(mask);
  let title = `id ${id} · ${part} · loss mask ${mask}`;
  if (logprob !== null && logprob !== undefined) {
    span.dataset.logprob = String(logprob);
    span.style.setProperty("--heat", heat(logprob));
    title += ` · logprob ${logprob.toFixed(3)} (p ${Math.exp(logprob).toFixed(3)})`;
  }
  span.title = title;
  span.textContent = text;
  return span;
}

function idsText(texts, ids) { return ids.map(id => tokenText(texts, id).text).join(""); }

function diffBox(diff, texts) {
  const what = diff.kind === "fork" || diff.kind === "retry" ? `${diff.kind} from trace ${diff.against_trace}`
    : `chain break (${diff.kind}) resuming trace ${diff.against_trace}`;
  return el("div", { class: "diff", dataset: { diffKind: diff.kind } },
    el("b", {}, what), " — the prompts share ", el("b", {}, diff.shared_tokens), " tokens, then part",
    diff.against_call_id ? el("span", { class: "muted" }, ` (against call ${diff.against_call_id})`) : null,
    el("div", { class: "muted" }, "shared context before the split:"),
    el("pre", { class: "ctx" }, idsText(texts, diff.context_ids)),
    el("div", { class: "cols" },
      el("div", {}, el("div", {}, `this prompt (${diff.ours_len} tokens) goes on with:`),
         el("pre", { class: "ours" }, idsText(texts, diff.ours_ids) || "(nothing: it ends here)")),
      el("div", {}, el("div", {}, `the earlier sequence (${diff.theirs_len} tokens) went on with:`),
         el("pre", { class: "theirs" }, idsText(texts, diff.theirs_ids) || "(nothing: it ended here)"))));
}

function traceSection(tr, texts, calls) {
  const meta = tr.metadata || {};
  const head = el("div", { class: "trace-head" },
    el("b", {}, `trace ${tr.index}`),
    meta.role ? badge(meta.role, meta.role === "main" ? "ok" : "RUNNING") : null,
    meta.break ? badge(`break: ${meta.break}`, "ERROR") : null,
    meta.parent_trace !== null && meta.parent_trace !== undefined ? badge(`branch of trace ${meta.parent_trace}`, "TIMEOUT") : null,
    el("span", {}, `${tr.prompt_ids.length} prompt + ${tr.response_ids.length} response tokens`),
    el("span", {}, `${tr.loss_mask.reduce((a, b) => a + b, 0)} trained`),
    el("span", {}, `calls ${tr.call_ids.length}`),
    el("span", {}, `finish ${tr.finish_reason || "–"}`),
    el("span", {}, `reward ${fmt.num(tr.reward)}`),
    meta.origin ? badge(`origin: ${meta.origin}`, "TIMEOUT") : null,
    meta.spawned_by ? el("a", { href: `#trace-${meta.spawned_by.trace_index}` },
      `spawned by trace ${meta.spawned_by.trace_index} (${meta.spawned_by.tool})`) : null,
    meta.continues_from ? el("a", { href: `#trace-${meta.continues_from.trace_index}` },
      `continues from trace ${meta.continues_from.trace_index} (${meta.continues_from.reason})`) : null);
  // Where the sampling policy changed (policy_versions: offsets into the response tokens).
  const versionAt = new Map((tr.policy_versions || []).filter((p, k) => k > 0).map(p => [p[0], p[1]]));
  const box = el("div", { class: "tokens" });
  const frag = document.createDocumentFragment();
  const marks = new Map(tr.boundaries.map(b => [b.position, b]));
  const nPrompt = tr.prompt_ids.length;
  const put = (pos) => {
    const b = marks.get(pos);
    if (b) {
      const call = calls[b.call_index] || {};
      frag.append(el("span", { class: "boundary" + (pos === nPrompt ? " first" : ""), dataset: { callIndex: b.call_index },
        title: `call ${b.call_index}: ${call.provider || ""} · ${fmt.ms(call.latency_ms)} · ${b.tokens_out} sampled · finish ${b.finish_reason || "–"}` },
        `▸ call ${b.call_index}`));
    }
  };
  tr.prompt_ids.forEach((id, i) => { put(i); frag.append(tokenSpan(texts, id, 0, "prompt", null)); });
  if (!marks.has(nPrompt)) frag.append(el("span", { class: "promptend", title: "end of the prompt" }, "▸ response"));
  const lps = tr.response_logprobs || [];
  tr.response_ids.forEach((id, i) => {
    put(nPrompt + i);
    if (versionAt.has(i)) frag.append(el("span", { class: "vboundary", dataset: { policyVersion: versionAt.get(i) },
      title: `from here sampled by policy version ${versionAt.get(i)}` }, `▸ v${versionAt.get(i)}`));
    const mask = tr.loss_mask[i] ? 1 : 0;
    frag.append(tokenSpan(texts, id, mask, "response", mask ? lps[i] : null));
  });
  box.append(frag);
  return el("section", { class: "trace", id: `trace-${tr.index}`, dataset: { traceIndex: tr.index } }, head,
            tr.diff ? diffBox(tr.diff, texts) : null, box);
}

function treeSection(tree) {
  // The session as a tree: sub-agents under the trace that spawned them, compaction continuations
  // under the summary's trace, retries and forks under their sibling (ui_tree.py).
  if (!tree || !tree.length) return el("p", { class: "muted" }, "no traces");
  return el("ul", { id: "lineage-tree", class: "tree" }, tree.map(n => el("li", {
      style: `margin-left:${n.depth * 1.5}em`, dataset: { treeTrace: n.index, treeParent: n.parent ?? "" } },
    el("a", { href: `#trace-${n.index}` }, `trace ${n.index}`), " ",
    n.origin ? badge(n.origin, n.origin === "root" ? "ok" : "RUNNING") : null, " ",
    el("span", { class: "muted" }, `${n.edge} · ${n.role || "–"} · ${n.calls} call${n.calls === 1 ? "" : "s"}`),
    n.versions.length > 1 ? el("span", {}, ` · policy versions ${n.versions.join(" → ")}`) : null)));
}

function gradeSection(grade) {
  if (!grade) return el("p", { class: "muted" }, "not graded (yet)");
  const tests = Object.entries(grade.tests || {});
  return el("div", { id: "grade" },
    kv([["status", badge(grade.status || "–", grade.status)], ["reward", fmt.num(grade.reward)],
        ["passed", grade.passed === null || grade.passed === undefined ? "–" : String(grade.passed)],
        ["grader", (grade.metadata || {}).grader || "–"],
        tests.length ? ["tests", `${tests.filter(([, s]) => String(s).toUpperCase() === "PASSED").length} / ${tests.length} passed`] : null]),
    tests.length ? el("table", { id: "tests" }, el("thead", {}, el("tr", {}, el("th", {}, "test"), el("th", {}, "status"))),
      el("tbody", {}, tests.map(([name, status]) => el("tr", {}, el("td", { class: "mono" }, name),
                                                        el("td", {}, badge(status, String(status).toUpperCase())))))) : null,
    el("details", {}, el("summary", {}, "grader details"), el("pre", { class: "json" }, pretty(grade.details || {}))));
}

function callsSection(sessionId, calls) {
  if (!calls.length) return el("p", { class: "muted" }, "no calls recorded");
  const body = el("tbody");
  for (const c of calls) {
    const detailRow = el("tr", { hidden: true }, el("td", { colspan: 12 }, el("div", { class: "muted" }, "loading…")));
    const row = el("tr", { class: "clickable", dataset: { callIndex: c.index }, onclick: async () => {
      detailRow.hidden = !detailRow.hidden;
      if (detailRow.dataset.loaded) return;
      detailRow.dataset.loaded = "1";
      try {
        const d = await api(`/ui/api/sessions/${encodeURIComponent(sessionId)}/calls/${c.index}`);
        detailRow.firstChild.replaceChildren(el("div", { class: "req" },
          el("div", {}, el("h3", {}, "request as the harness sent it"), el("pre", {}, pretty(d.request))),
          el("div", {}, el("h3", {}, `request as sent upstream ${d.upstream_url ? "(" + d.upstream_url + ")" : ""}`),
             el("pre", {}, pretty(d.upstream_request)))),
          el("h3", {}, "response message"), el("pre", { class: "json" }, pretty(d.response_message)));
      } catch (err) { detailRow.firstChild.replaceChildren(el("p", { class: "error" }, String(err.message))); }
    } },
      el("td", { class: "num" }, c.index), el("td", {}, c.provider), el("td", {}, c.stream ? "stream" : ""),
      el("td", { class: "num" }, fmt.ms(c.latency_ms)), el("td", { class: "num" }, c.tokens_in ?? "–"),
      el("td", { class: "num" }, c.tokens_out ?? "–"), el("td", {}, c.finish_reason || "–"),
      el("td", {}, badge(c.status || "–", c.status)),
      el("td", {}, c.tito === null || c.tito === undefined ? "–" : (c.tito ? "tokens" : "rendered")),
      el("td", { class: "mono" }, fmt.short(c.parent_call_id) || "–"),
      el("td", {}, c.policy_version ?? "–"),
      el("td", { class: "error" }, [c.error || "", ...(c.notes || [])].filter(x => x).join("; ").slice(0, 200)));
    body.append(row, detailRow);
  }
  return el("table", { id: "calls" }, el("thead", {}, el("tr", {},
    ["#", "provider", "", "latency", "tokens in", "tokens out", "finish", "status", "tito", "parent", "policy", "errors / notes"]
      .map(h => el("th", {}, h)))), body);
}

async function sessionPage(sessionId) {
  const enc = encodeURIComponent(sessionId);
  const [page, tokens] = await Promise.all([api(`/ui/api/sessions/${enc}`),
    api(`/ui/api/sessions/${enc}/tokens`).catch(err => ({ texts: {}, error: String(err.message) }))]);
  const s = page.session, traj = page.trajectory;
  setCrumbs(["tasks", "/ui/"], [s.task_id, `/ui/tasks/${encodeURIComponent(s.task_id)}`], [s.session_id]);
  const texts = tokens.texts || {};
  const tokenBox = el("div", { id: "traces" }, page.traces.map(tr => traceSection(tr, texts, page.calls)));
  const mode = el("select", { id: "colour-mode", onchange: () => {
      sessionStorage.setItem("polar-colour", mode.value);
      tokenBox.classList.toggle("heat", mode.value === "logprob");
    } },
    el("option", { value: "mask" }, "colour: loss mask"), el("option", { value: "logprob" }, "colour: logprob heat"));
  mode.value = sessionStorage.getItem("polar-colour") || "mask";
  tokenBox.classList.toggle("heat", mode.value === "logprob");
  const stats = traj ? traj.stats || {} : {};
  mount(
    el("h1", {}, "Session ", el("span", { class: "mono" }, s.session_id), " ", badge(s.state)),
    kv([["task", el("a", { href: `/ui/tasks/${encodeURIComponent(s.task_id)}` }, s.task_id)],
        ["sample", s.index], ["reward", fmt.num(s.reward ?? (traj && traj.reward))], ["attempt", s.attempt],
        ["node", s.node || "–"], ["policy version", s.policy_version ?? "–"],
        ["harness", page.task.agent.harness || "–"], ["builder", traj ? traj.builder : "–"],
        ["gateway session", s.gateway_session_id || "–"],
        ["group", el("a", { href: `/ui/groups/${encodeURIComponent(s.task_id)}` }, "side by side")]]),
    s.error ? el("p", { class: "error", id: "session-error" }, s.error) : null,
    el("h2", {}, "Stages"), timelineBar(s.timeline, true),
    el("table", { id: "stages" }, el("thead", {}, el("tr", {}, ["state", "started", "seconds", "node"].map(h => el("th", {}, h)))),
      el("tbody", {}, s.timeline.map(seg => el("tr", {}, el("td", {}, badge(seg.state)), el("td", {}, fmt.time(seg.start)),
        el("td", { class: "num" }, fmt.secs(seg.seconds)), el("td", { class: "mono" }, seg.node || "–"))))),
    el("h2", {}, "Reward and grade"), gradeSection(page.grade),
    el("h2", {}, `Calls (${page.calls.length})`),
    page.calls_error ? el("p", { class: "error" }, page.calls_error) : null,
    callsSection(sessionId, page.calls),
    el("h2", {}, "Trajectory"),
    page.tree && page.tree.length > 1 ? el("h3", {}, "Tree") : null,
    page.tree && page.tree.length > 1 ? treeSection(page.tree) : null,
    traj ? kv([["status", badge(traj.status)], ["source", traj.source === "live" ? "live (built by the gateway now)" : "stored result"],
               ["traces", stats.traces], ["calls", stats.calls], ["sampled tokens", stats.sampled_tokens],
               ["trained tokens", stats.delivered_tokens], ["delivered", fmt.num(stats.delivered_fraction, 4)],
               ["breaks", stats.breaks ?? "–"], ["conversations", stats.conversations ?? "–"],
               ["origins", stats.origins ? Object.entries(stats.origins).filter(e => e[1]).map(e => `${e[0]} ${e[1]}`).join(", ") : "–"],
               ["reward scope", stats.reward_scope || "session"]])
         : el("p", { class: "muted" }, "no trajectory yet"),
    tokens.error ? el("p", { class: "error", id: "token-error" }, `token text unavailable (ids shown): ${tokens.error}`) : null,
    el("div", { class: "controls" }, mode, el("div", { class: "legend" },
      el("span", {}, el("span", { class: "sw", style: "background:#fff" }), "prompt (mask 0)"),
      el("span", {}, el("span", { class: "sw", style: "background:var(--sampled)" }), "sampled, trained (mask 1)"),
      el("span", {}, el("span", { class: "sw", style: "background:var(--inter)" }), "interstitial: tool results etc. (mask 0)"),
      el("span", {}, el("span", { class: "sw", style: "background:linear-gradient(90deg,hsl(0,85%,78%),hsl(120,85%,86%))" }), "logprob heat: p low → high"),
      el("span", {}, el("span", { class: "boundary" }, "▸ call n"), "where a call's sampled tokens begin"))),
    tokenBox);
  document.body.dataset.ready = "1";
  // A running session: its calls and live trajectory grow; follow them (keeping the scroll).
  if (!["COMPLETED", "ERROR", "TIMEOUT"].includes(s.state)) {
    setTimeout(() => { const y = window.scrollY; sessionPage(sessionId).then(() => window.scrollTo(0, y)).catch(showError); }, 5000);
  }
}

// --- group -----------------------------------------------------------------------------------------
async function groupPage(taskId) {
  const g = await api(`/ui/api/groups/${encodeURIComponent(taskId)}`);
  setCrumbs(["tasks", "/ui/"], [g.task_id, `/ui/tasks/${encodeURIComponent(g.task_id)}`], ["group"]);
  const adv = v => v === null || v === undefined ? "–" : el("span", { class: v > 0 ? "adv-pos" : v < 0 ? "adv-neg" : "" }, (v > 0 ? "+" : "") + v.toFixed(3));
  mount(
    el("h1", {}, "Group ", el("span", { class: "mono" }, g.task_id), " ", badge(g.state)),
    kv([["samples", g.samples.length], ["mean reward", fmt.num(g.mean_reward)], ["reward std", fmt.num(g.reward_std)],
        ["policy version", g.policy_version ?? "–"],
        ["for GRPO", g.unusable ? badge(g.unusable.replace(/_/g, " "), "TIMEOUT") : badge("usable", "ok")]]),
    el("p", { class: "muted" }, g.instruction),
    el("p", { class: "muted" }, "advantage = reward − group mean; GRPO = that / (std + 1e-4) (Bessel std, as TRL); " +
       "RLOO = reward − mean of the others. Errors (no reward) take no part."),
    el("div", { class: "group", id: "group" }, g.samples.map(s => el("div", { class: "card", dataset: { sessionId: s.session_id } },
      el("h3", {}, `sample ${s.index} `, badge(s.state)),
      el("div", { class: "mono" }, el("a", { href: `/ui/sessions/${encodeURIComponent(s.session_id)}` }, s.session_id)),
      kv([["reward", fmt.num(s.reward)], ["advantage", adv(s.advantage)], ["GRPO", adv(s.advantage_normalised)],
          ["RLOO", adv(s.advantage_leave_one_out)],
          s.tests_total ? ["tests", `${s.tests_passed}/${s.tests_total}`] : null,
          ["calls", s.stats.calls ?? "–"], ["traces", s.stats.traces ?? "–"],
          ["trained tokens", s.stats.delivered_tokens ?? "–"]]),
      s.error ? el("p", { class: "error" }, s.error) : null,
      el("pre", {}, s.final_text || "(no assistant text)")))));
  document.body.dataset.ready = "1";
}

// --- routing -----------------------------------------------------------------------------------
document.getElementById("jump").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const id = document.getElementById("jump-id").value.trim();
  if (!id) return;
  const isTask = await fetch(`/ui/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" }).then(r => r.ok);
  location.href = isTask ? `/ui/tasks/${encodeURIComponent(id)}` : `/ui/sessions/${encodeURIComponent(id)}`;
});

function route() {
  const parts = location.pathname.replace(/^\/ui\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "tasks" && parts[1]) return taskPage(parts[1]);
  if (parts[0] === "sessions" && parts[1]) return sessionPage(parts[1]);
  if (parts[0] === "groups" && parts[1]) return groupPage(parts[1]);
  return tasksPage();
}
route().catch(showError);
