// Shared by the client tests: start `qrig serve` on the tiny fixture model (a free port chosen by the server,
// read from its log), wait for /health, and build clients: the official openai SDK (maxRetries 0) and raw
// helpers (fetch, SSE parsing, curl, raw sockets) for what an SDK hides.
import { spawn, execFile } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const BINARY = process.env.QRIG_BINARY ?? path.resolve(here, '../../../build/qrig');
export const SHARED = process.env.QRIG_SHARED_DIR ?? path.resolve(here, '../../../../shared');
export const TINY = path.join(SHARED, 'fixtures', 'tiny.gguf');
// Token ids of the tiny fixture (fixtures/README.md): <|endoftext|> = 1000, <|im_end|> = 1002.
export const EOG_BAN = { 1000: -100, 1002: -100 };

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts a server; resolves once GET /health answers 200. args: extra CLI flags.
// requestLog: keep the per-request log lines (off by default). QRIG_TEST_RIG (ctest's server_client_pipeline):
// the rig the model is compiled for (cpu-3-stages.toml: a 3-stage pipeline of CPU stages).
export async function startServer({ args = [], env = {}, parallel = 4, ctx = 2048, model = TINY, requestLog = false } = {}) {
  const rig = process.env.QRIG_TEST_RIG && model && !args.includes('--rig') ? ['--rig', process.env.QRIG_TEST_RIG] : [];
  const argv = ['serve', ...(model ? [model] : []), '--port', '0', '--parallel', String(parallel), '--ctx', String(ctx),
    ...(requestLog ? [] : ['--no-request-log']), ...rig, ...args];
  const proc = spawn(BINARY, argv, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  let done = false;
  exited.then(() => { done = true; });
  const deadline = Date.now() + 120_000;
  let port = 0;
  while (!port) {
    if (done || Date.now() > deadline) throw new Error(`qrig serve did not start:\n${log}`);
    const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
    if (m) port = Number(m[1]);
    else await sleep(20);
  }
  const base = `http://127.0.0.1:${port}`;
  for (;;) {
    if (done || Date.now() > deadline) throw new Error(`qrig serve never became healthy:\n${log}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.status === 200) break;
    } catch { /* not accepting yet */ }
    await sleep(50);
  }
  return {
    port,
    base,
    proc,
    exited,
    log: () => log,
    client: ({ apiKey = 'unused', timeout = 120_000 } = {}) =>
      new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout }),
    async stop() {
      if (done) return exited;
      proc.kill('SIGKILL');
      return exited;
    },
  };
}

export async function postJSON(base, route, body, headers = {}) {
  const r = await fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// The server still works: /health is 200 and a short chat request completes.
export async function assertAlive(assert, base) {
  const h = await fetch(`${base}/health`);
  assert.equal(h.status, 200);
  const r = await postJSON(base, '/v1/chat/completions',
    { messages: [{ role: 'user', content: 'still there?' }], max_tokens: 3, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, 'chat.completion');
}

// Runs curl; resolves {code, stdout, stderr} (never rejects on a non-zero exit).
export function curl(args, { input } = {}) {
  return new Promise((resolve) => {
    const p = execFile('curl', args, { maxBuffer: 64 << 20, encoding: 'buffer' }, (err, stdout, stderr) =>
      resolve({ code: err ? err.code ?? 1 : 0, stdout: stdout.toString('latin1'), stderr: stderr.toString() }));
    if (input !== undefined) { p.stdin.end(input); }
  });
}

// Splits an SSE body into its events' data payloads; throws on anything that is not "data: ...\n\n".
export function sseEvents(body) {
  const events = [];
  const parts = body.split('\n\n');
  if (parts.at(-1) !== '') throw new Error(`SSE body does not end with a blank line: ${JSON.stringify(body.slice(-80))}`);
  for (const part of parts.slice(0, -1)) {
    if (!part.startsWith('data: ') || part.includes('\n')) throw new Error(`bad SSE event: ${JSON.stringify(part)}`);
    events.push(part.slice(6));
  }
  return events;
}

// A raw TCP connection (for slow and vanishing clients).
export function rawConnect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

// Reads the server's Prometheus gauge/counter value.
export async function metric(base, name) {
  const t = await (await fetch(`${base}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(t);
  return m ? Number(m[1]) : undefined;
}

export function chatRequest(content, extra = {}) {
  return { model: 'tiny', messages: [{ role: 'user', content }], ...extra };
}
