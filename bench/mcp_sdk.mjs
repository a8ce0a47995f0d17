// The TypeScript SDK's client side of bench/mcp.lua: connect over stdio to
// the server given on the command line, then time echo calls.
//   node bench/mcp_sdk.mjs SEQ CONC INFLIGHT PROGRAM ARG...
// prints "sdk latency_us <median> seq_per_s <n> conc_per_s <n>"
const sdk = new URL("../spec/support/node/node_modules/@modelcontextprotocol/sdk/dist/esm/", import.meta.url);
const { Client } = await import(new URL("client/index.js", sdk));
const { StdioClientTransport } = await import(new URL("client/stdio.js", sdk));

const [seq, conc, inflight, command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, stderr: "ignore" });
const client = new Client({ name: "bench", version: "1" });
await client.connect(transport);
const call = (i) => client.callTool({ name: "echo", arguments: { text: "x" + i } });
for (let i = 0; i < 200; i++) await call(i);           // warm up
const lat = [];
let t0 = process.hrtime.bigint();
for (let i = 0; i < Number(seq); i++) {
  const a = process.hrtime.bigint();
  await call(i);
  lat.push(Number(process.hrtime.bigint() - a) / 1000);
}
const seqS = Number(process.hrtime.bigint() - t0) / 1e9;
lat.sort((x, y) => x - y);
let next = 0;
t0 = process.hrtime.bigint();
await Promise.all(Array.from({ length: Number(inflight) }, async () => {
  while (next < Number(conc)) { const i = next++; await call(i); }
}));
const concS = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`sdk latency_us ${lat[lat.length >> 1].toFixed(1)} seq_per_s ${(Number(seq) / seqS).toFixed(0)} conc_per_s ${(Number(conc) / concS).toFixed(0)}`);
await client.close();
