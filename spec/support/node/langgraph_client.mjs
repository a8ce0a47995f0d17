// The official LangGraph SDK client (@langchain/langgraph-sdk) against a
// `moongraph serve`, for spec/api_langgraph_sdk_spec.lua:
//   node langgraph_client.mjs URL SCENARIO [API_KEY [OTHER_API_KEY]]
// LG_SECOND_URL: another server of the same backend, where join_after_drop
// reconnects.
// Runs one scenario and prints one JSON object with what the SDK saw (an
// SDK error is recorded as {error, status} where a scenario expects one).
import { Client } from "@langchain/langgraph-sdk";

const [url, scenario, key, otherKey] = process.argv.slice(2);
const client = new Client({ apiUrl: url, apiKey: key ?? null, callerOptions: { maxRetries: 0 } });
const second = process.env.LG_SECOND_URL
  ? new Client({ apiUrl: process.env.LG_SECOND_URL, apiKey: key ?? null, callerOptions: { maxRetries: 0 } })
  : client;
const say = (text, extra = {}) => ({ messages: [{ role: "user", content: text }], ...extra });

async function collect(iter, limit = Infinity) {
  const out = [];
  for await (const part of iter) {
    out.push(part);
    if (out.length >= limit) break;
  }
  return out;
}

async function failure(promise) {
  try {
    await promise;
    return { error: null };
  } catch (e) {
    return { error: String(e?.message ?? e), status: e?.status ?? null };
  }
}

const scenarios = {
  async assistants() {
    const list = await client.assistants.search({ limit: 10 });
    const one = await client.assistants.get("agent");
    const graph = await client.assistants.getGraph("agent");
    const missing = await failure(client.assistants.get("nope"));
    return { list, one, graph, missing };
  },

  async threads() {
    const created = await client.threads.create({ metadata: { team: "blue" } });
    const got = await client.threads.get(created.thread_id);
    const found = await client.threads.search({ metadata: { team: "blue" } });
    const updated = await client.threads.update(created.thread_id, { metadata: { more: 1 } });
    await client.threads.delete(created.thread_id);
    const gone = await failure(client.threads.get(created.thread_id));
    return { created, got, found, updated, gone };
  },

  async stream_modes() {
    const out = {};
    for (const mode of ["values", "updates", "messages-tuple", "custom", "debug"]) {
      const thread = await client.threads.create();
      out[mode] = await collect(client.runs.stream(thread.thread_id, "agent", {
        input: say("hello world"), streamMode: mode,
      }));
    }
    const thread = await client.threads.create();
    out.all = await collect(client.runs.stream(thread.thread_id, "agent", {
      input: say("many modes"), streamMode: ["values", "updates", "messages-tuple", "custom"],
    }));
    return out;
  },

  async state() {
    const thread = await client.threads.create();
    const waited = await client.runs.wait(thread.thread_id, "agent", {
      input: say("keep me"), metadata: { team: "spec" },
    });
    const state = await client.threads.getState(thread.thread_id);
    const history = await client.threads.getHistory(thread.thread_id, { limit: 10 });
    const older = await client.threads.getState(thread.thread_id, history[1].checkpoint.checkpoint_id);
    const update = await client.threads.updateState(thread.thread_id, { values: { note: "by hand" }, asNode: "review" });
    const after = await client.threads.getState(thread.thread_id);
    return { waited, state, history, older, update, after };
  },

  async interrupt_resume() {
    const thread = await client.threads.create();
    const streamed = await collect(client.runs.stream(thread.thread_id, "agent", {
      input: say("deploy", { ask: "ship it?" }), streamMode: "values",
    }));
    const paused = await client.threads.get(thread.thread_id);
    const state = await client.threads.getState(thread.thread_id);
    const resumed = await client.runs.wait(thread.thread_id, "agent", { command: { resume: "yes" } });
    const done = await client.threads.get(thread.thread_id);
    return { streamed, paused, state, resumed, done };
  },

  async background() {
    const thread = await client.threads.create();
    const run = await client.runs.create(thread.thread_id, "agent", { input: say("later") });
    const joined = await client.runs.join(thread.thread_id, run.run_id);
    const fetched = await client.runs.get(thread.thread_id, run.run_id);
    const list = await client.runs.list(thread.thread_id);
    const replay = await collect(client.runs.joinStream(thread.thread_id, run.run_id));
    return { run, joined, fetched, list, replay };
  },

  async join_after_drop() {
    const thread = await client.threads.create();
    const run = await client.runs.create(thread.thread_id, "agent", {
      input: say("tick", { ticks: 6, every: 0.05 }), streamMode: "custom",
    });
    // read the first events, then drop the connection
    const controller = new AbortController();
    const first = [];
    for await (const part of client.runs.joinStream(thread.thread_id, run.run_id, { signal: controller.signal })) {
      first.push(part);
      if (part.event === "custom" && part.data.tick === 2) { controller.abort(); break; }
    }
    const lastEventId = first[first.length - 1].id;
    const rest = await collect(second.runs.joinStream(thread.thread_id, run.run_id, { lastEventId }));
    const state = await second.threads.getState(thread.thread_id);
    return { first, lastEventId, rest, state };
  },

  async multitask() {
    const thread = await client.threads.create();
    const busy = await client.runs.create(thread.thread_id, "agent", { input: say("slow", { hold: 30 }) });
    const rejected = await failure(client.runs.create(thread.thread_id, "agent", { input: say("second") }));
    const rejectedStream = await failure(collect(client.runs.stream(thread.thread_id, "agent", {
      input: say("second"), multitaskStrategy: "reject",
    })));
    const queued = await client.runs.create(thread.thread_id, "agent", {
      input: say("third", { hold: 0 }), multitaskStrategy: "enqueue",
    });
    await client.runs.cancel(thread.thread_id, busy.run_id, true);
    const cancelled = await client.runs.get(thread.thread_id, busy.run_id);
    const third = await client.runs.join(thread.thread_id, queued.run_id);
    const after = await client.runs.get(thread.thread_id, queued.run_id);
    return { rejected, rejectedStream, cancelled, third, after };
  },

  async stateless() {
    const waited = await client.runs.wait(null, "agent", { input: say("no thread") });
    const streamed = await collect(client.runs.stream(null, "agent", { input: say("no thread"), streamMode: "updates" }));
    return { waited, streamed };
  },

  async users() {
    const other = new Client({ apiUrl: url, apiKey: otherKey, callerOptions: { maxRetries: 0 } });
    const anonymous = new Client({ apiUrl: url, apiKey: null, callerOptions: { maxRetries: 0 } });
    const mine = await client.threads.create({ metadata: { owner: "me" } });
    await client.runs.wait(mine.thread_id, "agent", { input: say("private") });
    const theirs = await failure(other.threads.get(mine.thread_id));
    const theirState = await failure(other.threads.getState(mine.thread_id));
    const theirRun = await failure(other.runs.wait(mine.thread_id, "agent", { input: say("intrude") }));
    const theirSearch = await other.threads.search({});
    const mySearch = await client.threads.search({});
    const noKey = await failure(anonymous.threads.search({}));
    const badKey = await failure(new Client({ apiUrl: url, apiKey: "wrong-key-123", callerOptions: { maxRetries: 0 } })
      .threads.search({}));
    return { theirs, theirState, theirRun, theirSearch, mySearch, noKey, badKey };
  },
};

const fn = scenarios[scenario];
if (!fn) {
  console.error(`unknown scenario ${scenario}`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await fn()));
} catch (e) {
  console.log(JSON.stringify({ failed: String(e?.stack ?? e), status: e?.status ?? null }));
  process.exit(1);
}
