// The chat page of `moongraph serve`: a client of the Chat API (docs/api.md).
// A message is POSTed to /chat/messages; its run is then followed on the
// job's SSE stream: one card per node (name, running or done, duration),
// the answer as its tokens come, errors as they are reported. The
// conversation list and history come from /chat/conversations.
"use strict";

(() => {
  const KEY_STORE = "moongraph.apiKey";
  const LOCATION_STORE = "moongraph.location";
  const IDLE_LIMIT_MS = 45000;   // 3 missed heartbeats (the server's default is 15 s)
  const MAX_BACKOFF_MS = 10000;

  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  const view = { conversationId: null, generation: 0, streaming: 0 };

  // What the page has applied of each job's stream, by job id: read by the
  // browser spec (spec/web_chat_spec.lua) and handy in the devtools console.
  const runs = {};
  window.moongraphChat = { runs };

  // ------------------------------------------------------------ HTTP

  function authHeaders(extra) {
    const h = Object.assign({}, extra);
    const key = localStorage.getItem(KEY_STORE);
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  function describeFailure(status, body) {
    let msg = (body && (body.error || body.detail)) || "HTTP " + status;
    if (status === 401) msg += " — 설정에서 API 키를 입력하세요";
    return msg;
  }

  async function api(method, path, body) {
    const res = await fetch(path, {
      method,
      headers: authHeaders(body ? { "Content-Type": "application/json" } : {}),
      body: body ? JSON.stringify(body) : undefined,
      cache: "no-store",
    });
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = null; }
    }
    if (!res.ok) {
      const err = new Error(describeFailure(res.status, data));
      err.status = res.status;
      throw err;
    }
    return data;
  }

  // ------------------------------------------------------------ SSE

  // Reads an SSE body (text/event-stream) and calls on.event({event, id,
  // data}), on.retry(ms) and on.activity() (any bytes, heartbeats too).
  // TextDecoderStream keeps a character split across chunks whole.
  async function readSse(body, on) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    let ev = {};
    let data = null;
    const line = (l) => {
      if (l === "") {
        if (data !== null || ev.event !== undefined) {
          ev.data = data === null ? "" : data;
          on.event(ev);
        }
        ev = {};
        data = null;
        return;
      }
      if (l[0] === ":") return;
      const c = l.indexOf(":");
      const field = c < 0 ? l : l.slice(0, c);
      let value = c < 0 ? "" : l.slice(c + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "data") data = data === null ? value : data + "\n" + value;
      else if (field === "event") ev.event = value;
      else if (field === "id" && !value.includes("\0")) ev.id = value;
      else if (field === "retry" && /^\d+$/.test(value)) on.retry(Number(value));
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      on.activity();
      buf += value;
      for (;;) {
        const i = buf.search(/\r\n|\r|\n/);
        if (i < 0) break;
        // a lone \r at the end may be the first half of \r\n
        if (buf[i] === "\r" && i === buf.length - 1) break;
        const width = buf[i] === "\r" && buf[i + 1] === "\n" ? 2 : 1;
        line(buf.slice(0, i));
        buf = buf.slice(i + width);
      }
    }
  }

  function pause(ms) {
    return new Promise((resolve) => {
      const done = () => { clearTimeout(t); window.removeEventListener("online", done); resolve(); };
      const t = setTimeout(done, ms);
      window.addEventListener("online", done);
    });
  }

  // Follows a job's stream until its done event, reconnecting after a drop.
  //
  // The stream is read with fetch() rather than EventSource: EventSource
  // cannot send the Authorization header, and a key put in the URL instead
  // would end up in server logs and browser history. Reconnecting is then
  // ours to do, the way EventSource does it: the request after a drop
  // carries Last-Event-ID, the last id applied, and the server sends every
  // event after it. An id already applied is skipped all the same, so no
  // token is shown twice whatever the server or a proxy replays.
  async function follow(url, handlers) {
    const seen = new Set();
    let lastId = null;
    let retryMs = 1000;
    let drops = 0;
    for (;;) {
      const ctrl = new AbortController();
      let idle = null;
      const awake = () => {
        clearTimeout(idle);
        idle = setTimeout(() => ctrl.abort(), IDLE_LIMIT_MS);
      };
      let ended = false;
      let fatal = null;
      try {
        const h = authHeaders({ Accept: "text/event-stream" });
        if (lastId !== null) h["Last-Event-ID"] = lastId;
        awake();
        const res = await fetch(url, { headers: h, cache: "no-store", signal: ctrl.signal });
        if (res.status !== 200) {
          const body = await res.json().catch(() => null);
          const retryable = res.status === 429 || res.status >= 500;
          if (!retryable) {
            fatal = new Error(describeFailure(res.status, body));
          } else {
            const after = Number(res.headers.get("Retry-After"));
            if (after > 0) retryMs = Math.max(retryMs, after * 1000);
            throw new Error("HTTP " + res.status);
          }
        } else {
          handlers.connection(drops > 0 ? "resumed" : "streaming", drops);
          await readSse(res.body, {
            activity: awake,
            retry: (ms) => { retryMs = ms; },
            event: (ev) => {
              if (ev.id !== undefined) {
                if (seen.has(ev.id)) { handlers.duplicate(ev.id); return; }
                seen.add(ev.id);
                lastId = ev.id;
              }
              let data = null;
              try { data = ev.data ? JSON.parse(ev.data) : null; } catch (_) { data = { text: ev.data }; }
              const name = ev.event || "message";
              handlers.event(name, data, ev.id);
              if (name === "done") ended = true;
              // an error without an id comes from the stream itself (the
              // job's events are gone): nothing more will follow
              if (name === "error" && ev.id === undefined) fatal = new Error((data && data.error) || "stream error");
            },
          });
        }
      } catch (_) {
        // the connection dropped (or went idle): reconnect below
      } finally {
        clearTimeout(idle);
      }
      if (fatal) throw fatal;
      if (ended) return;
      drops += 1;
      handlers.connection("reconnecting", drops);
      await pause(Math.min(retryMs * 2 ** Math.min(drops - 1, 4), MAX_BACKOFF_MS));
    }
  }

  // ------------------------------------------------------------ a turn

  // One question and its answer, with the cards of the run's nodes.
  function newTurn(question, location) {
    const node = $("turn-template").content.firstElementChild.cloneNode(true);
    const user = node.querySelector(".bubble.user");
    user.textContent = question;
    if (location) user.appendChild(el("span", "location", "위치: " + location));
    $("welcome").hidden = true;
    $("messages").appendChild(node);
    node.scrollIntoView({ block: "end" });
    return {
      root: node,
      run: node.querySelector(".run"),
      steps: node.querySelector(".steps"),
      status: node.querySelector(".run-status"),
      answer: node.querySelector(".bubble.assistant"),
    };
  }

  function showAnswer(turn, text) {
    turn.answer.classList.remove("failed", "pending");
    turn.answer.textContent = text;
  }

  function showFailure(turn, message) {
    turn.answer.classList.remove("pending");
    turn.answer.classList.add("failed");
    turn.answer.textContent = "";
    turn.answer.appendChild(el("strong", null, "오류: "));
    turn.answer.appendChild(document.createTextNode(message));
  }

  function when(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    return d.toLocaleString("ko-KR", { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function formatMs(ms) {
    if (typeof ms !== "number") return "";
    return ms < 10 ? ms.toFixed(2) + " ms" : ms < 1000 ? ms.toFixed(1) + " ms" : (ms / 1000).toFixed(2) + " s";
  }

  // The run's nodes, one card each, the nodes of one step side by side.
  function nodeCards(turn) {
    const rows = new Map();
    const cards = new Map();
    // node_end carries no attempt: it belongs to the latest (a job resumed
    // after a restart runs its graph again as attempt 2, with the same task ids)
    let attempt = 1;
    const keyOf = (d) => attempt + "|" + (d.ns || "") + "|" + d.task_id;
    const row = (d) => {
      const step = String(d.task_id || "").split(":")[0];
      const key = attempt + "|" + (d.ns || "") + "|" + step;
      let r = rows.get(key);
      if (!r) {
        r = el("div", "step");
        r.dataset.step = step;
        turn.steps.appendChild(r);
        rows.set(key, r);
      }
      return r;
    };
    return {
      start(d) {
        if (d.attempt > attempt) {
          attempt = d.attempt;
          // what was running when the server stopped will not end
          for (const card of cards.values()) {
            if (!card.classList.contains("running")) continue;
            card.classList.replace("running", "stopped");
            card.querySelector(".state").textContent = "중단됨";
          }
        }
        turn.run.hidden = false;
        const card = el("div", "node running");
        card.dataset.node = d.node;
        card.appendChild(el("span", "name", d.node + (d.ns ? " (" + d.ns + ")" : "")));
        card.appendChild(el("span", "state", "실행 중"));
        card.appendChild(el("span", "duration", ""));
        row(d).appendChild(card);
        cards.set(keyOf(d), card);
      },
      end(d) {
        let card = cards.get(keyOf(d));
        if (!card) { this.start(d); card = cards.get(keyOf(d)); }
        const ok = d.status === "done" || d.status === undefined;
        card.classList.remove("running");
        card.classList.add(ok ? "done" : "failed");
        card.dataset.durationMs = String(d.duration_ms);
        card.querySelector(".state").textContent = ok ? "완료" : d.status === "error" ? "오류" : d.status;
        card.querySelector(".duration").textContent = formatMs(d.duration_ms);
        if (d.error) card.title = d.error;
      },
    };
  }

  // Follows one job into a turn. Resolves when the job is done or failed.
  async function runJob(turn, jobId, streamUrl, conversationId) {
    const record = { job_id: jobId, conversation_id: conversationId, ids: [], tokens: "", answer: null,
                     error: null, status: "streaming", drops: 0, duplicates: 0, attempt: 1 };
    runs[jobId] = record;
    turn.root.dataset.jobId = jobId;
    turn.answer.classList.add("pending");
    turn.answer.textContent = "";
    const cards = nodeCards(turn);
    const generation = view.generation;
    view.streaming += 1;
    updateComposer();
    const setStatus = (text) => { turn.status.textContent = text; };
    try {
      await follow(streamUrl, {
        connection(state, drops) {
          record.drops = drops;
          turn.root.dataset.connection = state;
          if (state === "reconnecting") setStatus("연결이 끊겼습니다 — 다시 연결하는 중… (" + drops + ")");
          else if (state === "resumed") setStatus("다시 연결했습니다 — 이어서 받는 중");
        },
        duplicate() { record.duplicates += 1; },
        event(name, d, id) {
          if (id !== undefined) record.ids.push(id);
          d = d || {};
          if (name === "node_start") {
            // a job resumed after a server restart runs again from its last
            // checkpoint: the answer's tokens start over
            if (d.attempt > record.attempt) {
              record.attempt = d.attempt;
              record.tokens = "";
              turn.answer.textContent = "";
            }
            cards.start(d);
          }
          else if (name === "node_end") cards.end(d);
          else if (name === "token") {
            if (typeof d.text === "string") {
              record.tokens += d.text;
              turn.answer.classList.remove("pending");
              turn.answer.textContent = record.tokens;
            }
          } else if (name === "answer") {
            record.answer = typeof d.answer === "string" ? d.answer : "";
            showAnswer(turn, record.answer);
          } else if (name === "error") {
            record.error = d.error || "알 수 없는 오류";
            showFailure(turn, (d.node ? "[" + d.node + "] " : "") + record.error);
          } else if (name === "done") {
            record.status = d.status || "done";
            setStatus("완료 · " + formatMs(d.duration_ms) + (record.drops ? " · 재연결 " + record.drops + "회" : ""));
          }
        },
      });
    } catch (err) {
      record.status = "failed";
      record.error = err.message;
      showFailure(turn, err.message);
      setStatus("");
    } finally {
      turn.root.dataset.status = record.status;
      if (view.generation === generation) {
        view.streaming -= 1;
        updateComposer();
      }
      loadConversations();
    }
  }

  // ------------------------------------------------------------ conversations

  function banner(message) {
    const b = $("banner");
    b.textContent = message || "";
    b.hidden = !message;
  }

  function updateComposer() {
    $("send").disabled = view.streaming > 0;
  }

  function resetView(conversationId) {
    view.generation += 1;
    view.streaming = 0;
    view.conversationId = conversationId;
    for (const t of document.querySelectorAll("#messages .turn")) t.remove();
    $("welcome").hidden = conversationId !== null;
    for (const li of document.querySelectorAll("#conversations li")) {
      li.classList.toggle("active", li.dataset.id === conversationId);
    }
    updateComposer();
  }

  async function loadConversations() {
    try {
      const page = await api("GET", "/chat/conversations?limit=50");
      const list = $("conversations");
      list.textContent = "";
      for (const c of page.items || []) {
        const li = el("li");
        li.dataset.id = c.id;
        if (c.id === view.conversationId) li.classList.add("active");
        const open = el("button", "open");
        open.type = "button";
        open.appendChild(el("span", "title", c.title || "(제목 없음)"));
        open.appendChild(el("span", "meta muted", when(c.updated_at)));
        open.addEventListener("click", () => openConversation(c.id));
        const del = el("button", "delete", "×");
        del.type = "button";
        del.title = "대화 삭제";
        del.addEventListener("click", () => deleteConversation(c.id));
        li.append(open, del);
        list.appendChild(li);
      }
      $("conversations-empty").hidden = (page.items || []).length > 0;
      banner(null);
    } catch (err) {
      banner("대화 목록을 불러오지 못했습니다: " + err.message);
    }
  }

  async function openConversation(id) {
    resetView(id);
    const generation = view.generation;
    let c;
    try {
      c = await api("GET", "/chat/conversations/" + encodeURIComponent(id));
    } catch (err) {
      banner("대화를 열지 못했습니다: " + err.message);
      return;
    }
    if (view.generation !== generation) return;
    const answers = new Map();
    for (const m of c.messages || []) if (m.role === "assistant") answers.set(m.job_id, m);
    for (const m of c.messages || []) {
      if (m.role !== "user") continue;
      const turn = newTurn(m.content, (m.context && m.context.user_location) || m.user_location);
      const a = answers.get(m.job_id);
      if (!a) {
        // still queued or running: follow it from its first event
        runJob(turn, m.job_id, "/chat/messages/" + encodeURIComponent(m.job_id) + "/stream", id);
      } else if (a.status === "failed") {
        showFailure(turn, a.error || "답변하지 못했습니다");
      } else {
        showAnswer(turn, typeof a.content === "string" ? a.content : "");
      }
    }
  }

  async function deleteConversation(id) {
    if (!window.confirm("이 대화를 삭제할까요?")) return;
    try {
      await api("DELETE", "/chat/conversations/" + encodeURIComponent(id));
    } catch (err) {
      banner("삭제하지 못했습니다: " + err.message);
      return;
    }
    if (view.conversationId === id) resetView(null);
    loadConversations();
  }

  async function send(message, location) {
    const body = { message };
    if (view.conversationId) body.conversation_id = view.conversationId;
    if (location) body.context = { user_location: location };
    const turn = newTurn(message, location);
    let job;
    try {
      job = await api("POST", "/chat/messages", body);
    } catch (err) {
      showFailure(turn, err.message);
      return;
    }
    if (!view.conversationId) {
      view.conversationId = job.conversation_id;
      loadConversations();
    }
    await runJob(turn, job.job_id, job.stream_url, job.conversation_id);
  }

  // ------------------------------------------------------------ wiring

  function init() {
    const key = $("api-key");
    key.value = localStorage.getItem(KEY_STORE) || "";
    key.addEventListener("change", () => {
      const v = key.value.trim();
      if (v) localStorage.setItem(KEY_STORE, v); else localStorage.removeItem(KEY_STORE);
      loadConversations();
    });
    const location = $("location");
    location.value = localStorage.getItem(LOCATION_STORE) || "";
    location.addEventListener("change", () => localStorage.setItem(LOCATION_STORE, location.value.trim()));

    const box = $("message");
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const message = box.value.trim();
      if (!message || view.streaming > 0) return;
      box.value = "";
      send(message, location.value.trim());
    });
    box.addEventListener("keydown", (e) => {
      // Enter sends, unless an IME (Korean input) is still composing
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("new-conversation").addEventListener("click", () => {
      resetView(null);
      box.focus();
    });
    loadConversations();
  }

  init();
})();
