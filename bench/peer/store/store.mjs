// bench/store.lua's workload on LangGraph.js's stores: put, get, a batch of
// 10 gets, and a filtered search, each from 64 concurrent workers, one
// round per run. Usage: node store.mjs memory|postgres <url> <per_task> <searches>
// Prints lines "peer <backend> <op> <ops/s>".
import { InMemoryStore } from "@langchain/langgraph";
import { PostgresStore } from "@langchain/langgraph-checkpoint-postgres/store";

const [backend, url, perTaskArg, searchesArg] = process.argv.slice(2);
const TASKS = 64;
const PER_TASK = Number(perTaskArg || 50);
const SEARCHES = Number(searchesArg || 10);

const ns = (t) => ["bench", "u" + (t % 8)];
const key = (t, i) => `k${i}-${t}`;

async function phase(name, perTask, fn) {
  const t0 = performance.now();
  const workers = [];
  for (let t = 0; t < TASKS; t++) {
    workers.push((async () => { for (let i = 0; i < perTask; i++) await fn(t, i); })());
  }
  await Promise.all(workers);
  const sec = (performance.now() - t0) / 1000;
  return (TASKS * perTask) / sec;
}

let store;
if (backend === "memory") {
  store = new InMemoryStore();
} else {
  store = new PostgresStore({ connectionOptions: { connectionString: url, max: 8 } });
  await store.setup();
}

const put = await phase("put", PER_TASK, (t, i) =>
  store.put(ns(t), key(t, i), { text: `memory number ${i} of task ${t}`, kind: i % 2 ? "odd" : "even", n: i }));
const get = await phase("get", PER_TASK, async (t, i) => {
  const item = await store.get(ns(t), key(t, (i * 7) % PER_TASK));
  if (!item || item.value.n !== (i * 7) % PER_TASK) throw new Error("wrong item");
});
const batch = await phase("batch", PER_TASK / 10, async (t, i) => {
  const ops = [];
  for (let j = 0; j < 10; j++) ops.push({ namespace: ns(t), key: key(t, (i * 10 + j) % PER_TASK) });
  const res = await store.batch(ops);
  if (res.length !== 10 || !res[9]) throw new Error("wrong batch");
});
const search = await phase("search", SEARCHES, async (t) => {
  const items = await store.search(ns(t), { filter: { kind: "even" }, limit: 10 });
  if (items.length !== 10) throw new Error("wrong search: " + items.length);
});
console.log(`peer ${backend} put ${put.toFixed(0)}`);
console.log(`peer ${backend} get ${get.toFixed(0)}`);
console.log(`peer ${backend} get_batch10 ${(batch * 10).toFixed(0)}`);
console.log(`peer ${backend} search ${search.toFixed(0)}`);
if (store.stop) await store.stop();
