// The node side of `make bench-server`: node's own http module answering
// every request with the same hello-world JSON as bench/server_app.lua.
//   node bench/server_node.js PORT     (0: any free port)
'use strict';
const http = require('http');
const server = http.createServer((req, res) => {
  const body = JSON.stringify({ hello: 'world' });
  res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
});
server.listen(Number(process.argv[2] || 0), '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${server.address().port} pid ${process.pid}`);
});
