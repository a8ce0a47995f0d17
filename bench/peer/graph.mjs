// The moongraph graph benchmarks on @langchain/langgraph (same graphs, same
// measurement: best of several rounds, wall time). Prints lines in the
// format of bench/graph_linear.lua and bench/graph_send.lua:
//   peer_linear plain <us> us/step
//   peer_linear memory_async <us> us/step   (MemorySaver, durability "async")
//   peer_send fanout_1000 <ms> ms/step
import { StateGraph, Annotation, START, END, Send, MemorySaver } from "@langchain/langgraph";

const N_NODES = 10;

function linear(checkpointer) {
  const State = Annotation.Root({
    count: Annotation(),
    items: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  });
  let g = new StateGraph(State);
  let prev = START;
  for (let i = 1; i <= N_NODES; i++) {
    const name = "n" + i;
    g = g.addNode(name, (s) => ({ count: s.count + 1, items: ["x"] }));
    g = g.addEdge(prev, name);
    prev = name;
  }
  g = g.addEdge(prev, END);
  return g.compile(checkpointer ? { checkpointer } : {});
}

function fanout() {
  const State = Annotation.Root({
    n: Annotation(),
    results: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  });
  return new StateGraph(State)
    .addNode("plan", () => ({}))
    .addNode("work", (arg) => ({ results: [arg.i] }))
    .addEdge(START, "plan")
    .addConditionalEdges("plan", (s) => {
      const sends = [];
      for (let i = 1; i <= s.n; i++) sends.push(new Send("work", { i }));
      return sends;
    }, ["work"])
    .compile();
}

async function bestOf(rounds, fn) {
  let best = Infinity;
  for (let r = 0; r < rounds; r++) best = Math.min(best, await fn());
  return best;
}

const iters = Number(process.argv[2] || 400);

const plain = linear(null);
const perStep = (app, n, cfgOf) => async () => {
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const out = await app.invoke({ count: 0, items: [] }, cfgOf ? cfgOf(i) : undefined);
    if (out.count !== N_NODES) throw new Error("wrong result");
  }
  return (performance.now() - t0) * 1000 / (n * N_NODES);
};
await perStep(plain, 50)();
console.log(`peer_linear plain ${(await bestOf(5, perStep(plain, iters))).toFixed(2)} us/step`);

let thread = 0;
const saved = linear(new MemorySaver());
const cfg = () => ({ configurable: { thread_id: "t" + (thread++) }, durability: "async" });
await perStep(saved, 20, cfg)();
console.log(`peer_linear memory_async ${(await bestOf(5, perStep(saved, Math.max(20, iters >> 1), cfg))).toFixed(2)} us/step`);

const fan = fanout();
const once = async () => {
  const t0 = performance.now();
  const out = await fan.invoke({ n: 1000, results: [] });
  if (out.results.length !== 1000 || out.results[999] !== 1000) throw new Error("wrong result");
  return performance.now() - t0;
};
for (let i = 0; i < 3; i++) await once();
console.log(`peer_send fanout_1000 ${(await bestOf(10, once)).toFixed(3)} ms/step`);
