// Start-up and shutdown of the real process as docs/server.md states them (issue 16): a start that fails exits
// 1 every time (never hangs), a missing model exits 1, a request on an idle keep-alive connection right after
// SIGTERM gets a 503, SIGHUP drains like SIGTERM, and the default drain fits Docker's 10 s stop grace.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, startServer, rawConnect, sleep, chatRequest, EOG_BAN } from './helpers.mjs';

// Runs `qrig serve ARGS` to its end; resolves {code, signal, log, ms}, or {hung: true} after timeoutMs (killed).
function runToExit(args, timeoutMs) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(BINARY, ['serve', ...args, '--port', '0', '--no-request-log'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    p.stdout.on('data', (d) => { log += d; });
    p.stderr.on('data', (d) => { log += d; });
    const t = setTimeout(() => { p.kill('SIGKILL'); resolve({ hung: true, log }); }, timeoutMs);
    p.on('close', (code, signal) => { clearTimeout(t); resolve({ code, signal, log, ms: Date.now() - t0 }); });
  });
}

async function exitWithin(srv, ms) {
  const t = setTimeout(() => srv.proc.kill('SIGKILL'), ms);
  const r = await srv.exited;
  clearTimeout(t);
  return r;
}

describe('start-up and shutdown', () => {
  it('a start that fails exits 1 every time (24 unreadable models at once)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qrig-bad-'));
    const bad = path.join(dir, 'broken.gguf');
    fs.writeFileSync(bad, 'GGUF this is not a model');
    try {
      const runs = await Promise.all(Array.from({ length: 24 }, () => runToExit([bad], 15000)));
      for (const r of runs) {
        assert.ok(!r.hung, `a failing start hung:\n${r.log}`);
        assert.equal(r.code, 1, r.log);
        assert.match(r.log, /cannot load the model/);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a model path that does not exist exits 1', async () => {
    const r = await runToExit(['/nonexistent/model.gguf'], 15000);
    assert.ok(!r.hung);
    assert.equal(r.code, 1, r.log);
    assert.match(r.log, /no such model/);
  });

  it('after SIGTERM a request on an idle keep-alive connection gets a 503', async () => {
    const srv = await startServer({ parallel: 1 });
    const s = await rawConnect(srv.port);
    let got = '';
    s.on('data', (d) => { got += d; });
    s.on('error', () => {});
    s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    for (let i = 0; i < 100 && !got.includes('"status":"ok"'); ++i) await sleep(10);
    assert.match(got, /^HTTP\/1\.1 200 /);
    got = '';
    srv.proc.kill('SIGTERM');
    await sleep(100);
    s.write('GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n');
    const closed = new Promise((resolve) => s.on('close', resolve));
    await Promise.race([closed, sleep(3000)]);
    assert.match(got, /^HTTP\/1\.1 503 /, `got: ${JSON.stringify(got.slice(0, 200))}`);
    assert.match(got, /Connection: close/i);
    assert.match(got, /shutting down/);
    const { code, signal } = await exitWithin(srv, 10000);
    assert.equal(signal, null);
    assert.equal(code, 0, srv.log());
  });

  it('SIGHUP drains like SIGTERM (a request in flight completes) and exits 0', async () => {
    const srv = await startServer({ parallel: 1 });
    const whole = fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(chatRequest('go on', { max_tokens: 60, logit_bias: EOG_BAN })),
    });
    for (let i = 0; i < 200; ++i) {
      const h = await (await fetch(`${srv.base}/health`)).json();
      if (h.slots_processing === 1) break;
      await sleep(10);
    }
    srv.proc.kill('SIGHUP');
    const r = await whole;
    assert.equal(r.status, 200);
    assert.equal((await r.json()).usage.completion_tokens, 60);
    const { code, signal } = await exitWithin(srv, 10000);
    assert.equal(signal, null, 'killed by the signal');
    assert.equal(code, 0, srv.log());
    assert.match(srv.log(), /SIGHUP: draining/);
  });

  it('by default the drain ends within Docker\'s 10 s stop grace, even with a long request running', async () => {
    const srv = await startServer({ parallel: 1, ctx: 8192 });
    const client = srv.client();
    const stream = await client.chat.completions.create(chatRequest('forever', { max_tokens: 8000, logit_bias: EOG_BAN, stream: true }));
    const iter = stream[Symbol.asyncIterator]();
    await iter.next();
    const t0 = Date.now();
    srv.proc.kill('SIGTERM');
    const drained = (async () => { try { for (let r = await iter.next(); !r.done; r = await iter.next()); } catch { /* cancelled */ } })();
    const { code } = await exitWithin(srv, 15000);
    await drained;
    const ms = Date.now() - t0;
    assert.equal(code, 0, srv.log());
    assert.ok(ms < 10000, `exit took ${ms} ms`);
  });
});
