// Hostile clients against the real `qrig serve` process, over raw sockets where the bytes matter (issue 16):
// stalled and trickling clients, keep-alive floods, request smuggling (CL+TE, unknown methods with bodies,
// bad chunk framing, odd transfer codings), body limits for chunked and compressed bodies, Range on API
// responses, memory after large /tokenize requests, out-of-range numbers, huge objects, the ignored-fields
// header, log forging, the API key before routing, malformed chat messages. Every case is bounded in time
// and connection count; after each the server still serves.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import zlib from 'node:zlib';
import { startServer, postJSON, assertAlive, rawConnect, sleep } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer({ parallel: 2, args: ['--max-body', String(1 << 20)] }); });
after(async () => { await srv?.stop(); });

const chatBody = (extra = {}) => JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], max_tokens: 2, temperature: 0, ...extra });

// Writes `payload` on a new connection (optionally half-closing after it) and collects what comes back until
// the server closes or timeoutMs passes.
async function exchange(payload, { timeoutMs = 3000, end = false } = {}) {
  const s = await rawConnect(srv.port);
  const chunks = [];
  s.on('data', (d) => chunks.push(d));
  s.on('error', () => {});
  let closed = false;
  const done = new Promise((resolve) => s.on('close', () => { closed = true; resolve(); }));
  s.write(Buffer.isBuffer(payload) ? payload : Buffer.from(payload, 'latin1'));
  if (end) s.end();
  await Promise.race([done, sleep(timeoutMs)]);
  s.destroy();
  const text = Buffer.concat(chunks).toString('latin1');
  return { text, closed, statuses: [...text.matchAll(/HTTP\/1\.[01] (\d{3}) /g)].map((m) => Number(m[1])) };
}

// GET /health on a new connection (not fetch's pooled keep-alive one, which a thread may already serve).
async function timedHealth(ms) {
  const t0 = Date.now();
  const r = await exchange('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { timeoutMs: ms });
  return { status: r.statuses[0], ms: Date.now() - t0 };
}

function rssMiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m[1]) / 1024;
}

describe('connection layer', () => {
  it('100 clients stalled mid-header leave /health answering', async () => {
    const stalled = [];
    for (let i = 0; i < 100; ++i) {
      const s = await rawConnect(srv.port);
      s.on('error', () => {});
      s.write('GET /health HTTP/1.1\r\nHost: x\r\nX-Part');
      stalled.push(s);
    }
    try {
      await sleep(100);
      const h = await timedHealth(2000);
      assert.equal(h.status, 200);
    } finally {
      for (const s of stalled) s.destroy();
    }
  });

  it('a client trickling its head one byte at a time is cut off by the head deadline (408)', async () => {
    // QRIG_HEAD_TIMEOUT through the environment: a binary without the setting still starts (and fails here).
    const quick = await startServer({ parallel: 1, env: { QRIG_HEAD_TIMEOUT: '2' } });
    const s = await rawConnect(quick.port);
    let got = '';
    s.on('data', (d) => { got += d; });
    s.on('error', () => {});
    const closed = new Promise((resolve) => s.on('close', resolve));
    const head = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'y'.repeat(200) + '\r\n\r\n';
    const t0 = Date.now();
    let i = 0;
    const timer = setInterval(() => { if (i < head.length && !s.destroyed) s.write(head[i++]); }, 100);
    await Promise.race([closed, sleep(6000)]);
    clearInterval(timer);
    s.destroy();
    await quick.stop();
    assert.ok(Date.now() - t0 < 5000, 'the trickling client was still connected after 5 s');
    assert.match(got, /^HTTP\/1\.1 408 /);
  });

  it('500 idle keep-alive connections do not slow a new client', async () => {
    const idle = [];
    for (let i = 0; i < 500; ++i) {
      const s = await rawConnect(srv.port);
      s.on('error', () => {});
      s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
      idle.push(s);
    }
    try {
      await sleep(300);
      const h = await timedHealth(3000);
      assert.equal(h.status, 200);
      assert.ok(h.ms < 1000, `a new /health took ${h.ms} ms`);
    } finally {
      for (const s of idle) s.destroy();
    }
  });

  it('--max-queue 8000 does not start thousands of threads', async () => {
    const big = await startServer({ parallel: 1, args: ['--max-queue', '8000'] });
    try {
      const threads = fs.readdirSync(`/proc/${big.proc.pid}/task`).length;
      assert.ok(threads < 100, `${threads} threads`);
    } finally {
      await big.stop();
    }
  });
});

describe('request smuggling and strict framing', () => {
  const smuggled = 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n';

  it('Content-Length with Transfer-Encoding: chunked is a 400 and nothing after it runs', async () => {
    const body = `0\r\n\r\n${smuggled}`;
    const r = await exchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\nTransfer-Encoding: chunked\r\n\r\n${body}`);
    assert.deepEqual(r.statuses, [400], r.text);
  });

  for (const method of ['PROPFIND', 'PURGE', 'get']) {
    it(`an unknown method (${method}) with a body: one error, its body never runs as a request`, async () => {
      const r = await exchange(`${method} /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`);
      assert.equal(r.statuses.length, 1, r.text);
      assert.ok(r.statuses[0] >= 400, r.text);
      assert.doesNotMatch(r.text, /"object":"list"/);
    });
  }

  it('two different Content-Length headers are a 400', async () => {
    const body = chatBody();
    const r = await exchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n` +
      `Content-Length: 5\r\n\r\n${body}`);
    assert.deepEqual(r.statuses, [400], r.text);
  });

  for (const [name, chunk] of [['+3e', '+3e'], ['0x3e', '0x3e']]) {
    it(`a chunk size written ${name} is a 400`, async () => {
      const body = '{"content": "hi"}'.padEnd(0x3e, ' ');  // valid JSON of exactly 0x3e bytes
      const r = await exchange(`POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n` +
        `${chunk}\r\n${body}\r\n0\r\n\r\n`);
      assert.deepEqual(r.statuses, [400], r.text);
    });
  }

  it('chunk data without its CRLF is a 400', async () => {
    const body = chatBody();
    const r = await exchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `${body.length.toString(16)}\r\n${body}XX0\r\n\r\n`);
    assert.deepEqual(r.statuses, [400], r.text);
  });

  it('Transfer-Encoding: identity, chunked is refused at once, not left waiting for the client to close', async () => {
    const body = chatBody();
    const t0 = Date.now();
    const r = await exchange(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity, chunked\r\n\r\n` +
      `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`, { timeoutMs: 4000 });
    assert.ok(r.closed && Date.now() - t0 < 3000, `no answer within 3 s: ${r.text}`);
    assert.deepEqual(r.statuses, [501], r.text);
  });

  it('a bare LF line end is a 400', async () => {
    const r = await exchange('GET /health HTTP/1.1\nHost: x\n\n');
    assert.deepEqual(r.statuses, [400], r.text);
  });
});

describe('body limits', () => {
  it('a chunked body over --max-body is a 413', async () => {
    const content = 'a'.repeat(3 << 20);
    const body = JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: 1 });
    let wire = 'POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
    for (let i = 0; i < body.length; i += 65536) {
      const part = body.slice(i, i + 65536);
      wire += `${part.length.toString(16)}\r\n${part}\r\n`;
    }
    wire += '0\r\n\r\n';
    const r = await exchange(wire, { timeoutMs: 10000 });
    assert.equal(r.statuses[0], 413, r.text.slice(0, 300));
    await assertAlive(assert, srv.base);
  });

  it('the bodies held at once are bounded: past 64 MiB of them (8 x --max-body) a request gets a 503', async () => {
    const socks = [];
    const answers = [];
    try {
      for (let i = 0; i < 72; ++i) {
        const s = await rawConnect(srv.port);
        s.on('error', () => {});
        let got = '';
        s.on('data', (d) => { got += d; });
        answers.push(() => got);
        s.write(`POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${1 << 20}\r\n\r\n{`);
        socks.push(s);
      }
      await sleep(300);
      const busy = answers.filter((a) => /^HTTP\/1\.1 503 /.test(a())).length;
      assert.ok(busy >= 8, `${busy} of 72 connections declaring 1 MiB bodies got a 503`);
      assert.ok(answers.slice(0, 60).every((a) => a() === ''), 'the first 60 bodies were refused');
    } finally {
      for (const s of socks) s.destroy();
    }
    await sleep(100);
    await assertAlive(assert, srv.base);
  });

  it('a gzip body is a 415 and is never inflated (a bomb costs nothing)', async () => {
    const rss0 = rssMiB(srv.proc.pid);
    const inner = Buffer.concat([Buffer.from('{"content": "'), Buffer.alloc(256 << 20, 'a'), Buffer.from('"}')]);
    const bomb = zlib.gzipSync(inner, { level: 9 });
    assert.ok(bomb.length < (1 << 20));
    const head = `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n` +
      `Content-Length: ${bomb.length}\r\n\r\n`;
    const r = await exchange(Buffer.concat([Buffer.from(head, 'latin1'), bomb]), { timeoutMs: 10000 });
    assert.equal(r.statuses[0], 415, r.text.slice(0, 300));
    assert.ok(rssMiB(srv.proc.pid) - rss0 < 64, 'the server inflated the body');
  });
});

describe('responses', () => {
  it('Range is not applied to API responses', async () => {
    const whole = await (await fetch(`${srv.base}/v1/models`)).text();
    const one = await fetch(`${srv.base}/v1/models`, { headers: { Range: 'bytes=0-0' } });
    assert.equal(one.status, 200);
    assert.equal(one.headers.get('content-range'), null);
    assert.equal(await one.text(), whole);
    const many = Array.from({ length: 500 }, (_, i) => `${i}-${i}`).join(',');
    const r = await fetch(`${srv.base}/v1/models`, { headers: { Range: `bytes=${many}` } });
    assert.equal(r.status, 200);
    assert.equal((await r.text()).length, whole.length);
  });

  it('memory is returned after large /tokenize requests with pieces', async () => {
    const rss0 = rssMiB(srv.proc.pid);
    const content = 'hello world, '.repeat(60000);
    for (let i = 0; i < 3; ++i) {
      const r = await postJSON(srv.base, '/tokenize', { content, with_pieces: true });
      assert.equal(r.status, 200);
      assert.ok(r.json.count > 100000);
    }
    await sleep(200);
    const grown = rssMiB(srv.proc.pid) - rss0;
    assert.ok(grown < 150, `RSS grew by ${grown.toFixed(0)} MiB`);
  });
});

describe('requests', () => {
  it('an out-of-range number (1e400) is a 400 on every JSON route', async () => {
    for (const [route, body] of [['/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}'],
      ['/v1/completions', '{"prompt": "x", "temperature": 1e400}'], ['/tokenize', '{"content": "x", "n": 1e400}'],
      ['/detokenize', '{"tokens": [1e400]}']]) {
      const r = await postJSON(srv.base, route, body);
      assert.equal(r.status, 400, `${route}: ${r.text}`);
      assert.equal(r.json.error.type, 'invalid_request_error');
    }
  });

  it('an object with 80,000 keys parses in linear time; the ignored-fields header stays short', async () => {
    const extra = {};
    for (let i = 0; i < 80000; ++i) extra[`k${i}`] = 0;
    const t0 = Date.now();
    const r = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: chatBody(extra), signal: AbortSignal.timeout(6000),
    });
    assert.equal(r.status, 200);
    assert.ok(Date.now() - t0 < 4000, `${Date.now() - t0} ms`);
    const ignored = r.headers.get('x-qrig-ignored-fields');
    assert.ok(ignored.startsWith('k0,k1,'), ignored.slice(0, 40));
    assert.ok(ignored.length < 2048, `${ignored.length} bytes`);
    assert.match(ignored, /more\)$/);
  });

  it('malformed chat messages and tool parameters are 400s', async () => {
    const cases = [
      { messages: [{ role: 'user' }] },
      { messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: 'y', reasoning_content: 5 }, { role: 'user', content: 'z' }] },
      { messages: [{ role: 'user', content: 'x' }], tool_choice: 'required',
        tools: [{ type: 'function', function: { name: 'f', parameters: 'not a schema' } }] },
    ];
    for (const body of cases) {
      const r = await postJSON(srv.base, '/v1/chat/completions', { ...body, max_tokens: 2 });
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
    }
  });
});

describe('log forging and the API key', () => {
  it('newlines in a field name or an encoded path do not write log lines', async () => {
    const s = await startServer({ parallel: 1, requestLog: true });
    try {
      await postJSON(s.base, '/v1/chat/completions', `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "a\\nqrig serve: FORGED1": 1}`);
      await fetch(`${s.base}/v1/nothing%0Aqrig%20serve:%20FORGED2`);
      await sleep(100);
      const lines = s.log().split('\n');
      assert.ok(!lines.some((l) => l.startsWith('qrig serve: FORGED')), s.log().slice(-600));
      assert.match(s.log(), /FORGED1/);
      assert.match(s.log(), /FORGED2/);
    } finally {
      await s.stop();
    }
  });

  it('without the key every route but /health is a 401, before 404/405; a NUL in the key is refused', async () => {
    const s = await startServer({ parallel: 1, args: ['--api-key', 'k-test'] });
    try {
      assert.equal((await fetch(`${s.base}/no/such/route`)).status, 401);
      assert.equal((await fetch(`${s.base}/v1/chat/completions`)).status, 401);
      assert.equal((await fetch(`${s.base}/health`)).status, 200);
      const ok = await fetch(`${s.base}/v1/models`, { headers: { Authorization: 'Bearer k-test' } });
      assert.equal(ok.status, 200);
      const sock = await rawConnect(s.port);
      let got = '';
      sock.on('data', (d) => { got += d; });
      const closed = new Promise((resolve) => sock.on('close', resolve));
      sock.end(Buffer.from('GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-test\0x\r\nConnection: close\r\n\r\n', 'latin1'));
      await Promise.race([closed, sleep(3000)]);
      sock.destroy();
      assert.match(got, /^HTTP\/1\.1 4\d\d /, got);
    } finally {
      await s.stop();
    }
  });
});
