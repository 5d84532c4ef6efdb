// The nginx configuration documented in docs/server.md ("Behind nginx"), run as written (only the two ports
// replaced) in front of `qrig serve`: a streamed chat completion arrives through it event by event (not
// buffered to the end), whole responses and errors pass unchanged, bodies up to --max-body pass and larger
// ones are nginx's 413. Skipped where nginx is not installed (scripts/install-deps.sh installs nginx-light).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, postJSON, sleep, chatRequest, EOG_BAN } from './helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const nginxBinary = ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => fs.existsSync(p));

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// The ```nginx block of docs/server.md.
function documentedConfig() {
  const doc = fs.readFileSync(path.resolve(here, '../../../docs/server.md'), 'utf8');
  const m = /```nginx\n([\s\S]*?)```/.exec(doc);
  assert.ok(m, 'docs/server.md has no ```nginx block');
  return m[1];
}

describe('behind nginx (the documented configuration)', { skip: !nginxBinary && 'nginx is not installed' }, () => {
  let srv, nginx, dir, base, log = '';
  before(async () => {
    srv = await startServer({ parallel: 2 });
    const port = await freePort();
    const conf = documentedConfig();
    assert.match(conf, /server 127\.0\.0\.1:8080;/);
    assert.match(conf, /listen 80;/);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qrig-nginx-'));
    fs.chmodSync(dir, 0o777);  // nginx's workers (not root) write request bodies below it
    const main = `error_log ${dir}/error.log;\npid ${dir}/nginx.pid;\nevents {}\nhttp {\n` +
      `access_log off;\n${conf.replace('127.0.0.1:8080', `127.0.0.1:${srv.port}`).replace('listen 80;', `listen 127.0.0.1:${port};`)}\n}\n`;
    fs.writeFileSync(path.join(dir, 'nginx.conf'), main);
    execFileSync(nginxBinary, ['-t', '-p', dir, '-c', path.join(dir, 'nginx.conf')], { stdio: 'pipe' });
    nginx = spawn(nginxBinary, ['-p', dir, '-c', path.join(dir, 'nginx.conf'), '-g', 'daemon off;'], { stdio: ['ignore', 'pipe', 'pipe'] });
    nginx.stderr.on('data', (d) => { log += d; });
    base = `http://127.0.0.1:${port}`;
    for (let i = 0; i < 100; ++i) {
      try { if ((await fetch(`${base}/health`)).status === 200) return; } catch { /* starting */ }
      await sleep(50);
    }
    throw new Error(`nginx did not come up: ${log}`);
  });
  after(async () => {
    if (nginx) { nginx.kill('SIGQUIT'); await new Promise((r) => nginx.on('exit', r)); }
    await srv?.stop();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a stream arrives event by event, then [DONE]', async () => {
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(chatRequest('stream through nginx', { max_tokens: 120, logit_bias: EOG_BAN, stream: true })),
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('content-type'), 'text/event-stream');
    const reader = r.body.getReader();
    const t0 = Date.now();
    let text = '', firstEventMs = -1, reads = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      reads += 1;
      text += Buffer.from(value).toString('utf8');
      if (firstEventMs < 0 && text.includes('data: ')) firstEventMs = Date.now() - t0;
    }
    const total = Date.now() - t0;
    assert.ok(text.trimEnd().endsWith('data: [DONE]'), text.slice(-200));
    assert.ok(reads > 10, `${reads} reads: nginx buffered the stream`);
    assert.ok(firstEventMs < total / 2, `first event after ${firstEventMs} of ${total} ms`);
  });

  it('whole responses and error objects pass unchanged', async () => {
    const ok = await postJSON(base, '/v1/chat/completions', chatRequest('hi', { max_tokens: 3 }));
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.object, 'chat.completion');
    const bad = await postJSON(base, '/v1/chat/completions', '{"messages": [');
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.type, 'invalid_request_error');
  });

  it("client_max_body_size matches --max-body: 4 MiB reaches qrig (nginx's default is 1 MiB), 17 MiB is refused (413)", async () => {
    const big = await postJSON(base, '/tokenize', { content: 'x'.repeat(4 << 20) });
    assert.equal(big.status, 200, big.text.slice(0, 200));
    const r = await postJSON(base, '/v1/chat/completions', chatRequest('x'.repeat(17 << 20)));
    assert.equal(r.status, 413);
  });
});
