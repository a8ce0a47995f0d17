// The official MCP TypeScript SDK client against a server given on the
// command line, for spec/mcp_server_spec.lua:
//   node sdk_client.mjs stdio  PROGRAM ARG...   start the server over stdio
//   node sdk_client.mjs http   URL              Streamable HTTP
// Reads one JSON list of steps from stdin: [{"call": name, "args": {...}}, {"list": true}, ...],
// and prints one JSON object with what each step gave ({tools} or {result} or {error}).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, ...rest] = process.argv.slice(2);
let input = "";
for await (const chunk of process.stdin) input += chunk;
const steps = JSON.parse(input || "[]");

const transport = mode === "http"
  ? new StreamableHTTPClientTransport(new URL(rest[0]))
  : new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "ignore" });
const client = new Client({ name: "sdk-check", version: "1.0.0" });
const out = { steps: [] };
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.capabilities = client.getServerCapabilities();
  for (const step of steps) {
    try {
      if (step.list) out.steps.push({ tools: (await client.listTools()).tools });
      else out.steps.push({ result: await client.callTool({ name: step.call, arguments: step.args }) });
    } catch (e) {
      out.steps.push({ error: String(e && e.message || e) });
    }
  }
} catch (e) {
  out.error = String(e && e.message || e);
}
await client.close().catch(() => {});
process.stdout.write(JSON.stringify(out) + "\n");
