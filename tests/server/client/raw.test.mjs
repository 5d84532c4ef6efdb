// The wire below the SDK, with curl and raw sockets: exact SSE framing and headers, and hostile or broken
// clients (malformed JSON, wrong types, a body over the limit, invalid UTF-8, oversized headers, a client
// that sends slowly, one that stops reading, ones that vanish mid-request). After each, the server still
// answers /health and a normal request, and a vanished client's generation stops.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, assertAlive, curl, sseEvents, rawConnect, metric, sleep, EOG_BAN } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer({ parallel: 2, args: ['--max-body', String(1 << 20)] }); });
after(async () => { await srv?.stop(); });

const chat = (extra = {}) => JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], temperature: 0, ...extra });

// Sends a raw HTTP/1.1 request (Connection: close) and returns {status, headers, body} once the server closes.
async function rawRequest(payload, { delayMs = 0, chunk = 1 } = {}) {
  const s = await rawConnect(srv.port);
  const data = [];
  s.on('data', (d) => data.push(d));
  const ended = new Promise((resolve) => s.on('close', resolve));
  const buf = Buffer.from(payload, 'latin1');
  if (delayMs === 0) s.write(buf);
  else for (let i = 0; i < buf.length; i += chunk) { s.write(buf.subarray(i, i + chunk)); await sleep(delayMs); }
  await ended;
  return parseResponse(Buffer.concat(data).toString('latin1'));
}

// dechunk: false for curl's output (curl has already decoded the chunked transfer encoding).
function parseResponse(text, dechunk = true) {
  const head = text.indexOf('\r\n\r\n');
  const lines = text.slice(0, head).split('\r\n');
  const status = Number(lines[0].split(' ')[1]);
  const headers = Object.fromEntries(lines.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
  let body = text.slice(head + 4);
  if (dechunk && headers['transfer-encoding'] === 'chunked') {
    let out = '';
    for (;;) {
      const eol = body.indexOf('\r\n');
      const n = parseInt(body.slice(0, eol), 16);
      if (!n) break;
      out += body.slice(eol + 2, eol + 2 + n);
      body = body.slice(eol + 2 + n + 2);
    }
    body = out;
  }
  return { status, headers, body };
}

const post = (body, extraHeaders = '') => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n` +
  `Content-Type: application/json\r\n${extraHeaders}Content-Length: ${Buffer.byteLength(body, 'latin1')}\r\n\r\n${body}`;

async function waitIdle() {
  for (let i = 0; i < 200; ++i) {
    if ((await metric(srv.base, 'qrig_requests_running')) === 0 && (await metric(srv.base, 'qrig_requests_queued')) === 0) return true;
    await sleep(10);
  }
  return false;
}

describe('raw HTTP', () => {
  it('SSE framing and headers, exactly (curl -N)', async () => {
    const r = await curl(['-sS', '-N', '-i', '-H', 'Content-Type: application/json', '--data-binary',
      chat({ stream: true, max_tokens: 8, stream_options: { include_usage: true } }), `${srv.base}/v1/chat/completions`]);
    assert.equal(r.code, 0, r.stderr);
    const { status, headers, body } = parseResponse(r.stdout, false);
    assert.equal(headers['transfer-encoding'], 'chunked');
    assert.equal(status, 200);
    assert.equal(headers['content-type'], 'text/event-stream');
    assert.equal(headers['cache-control'], 'no-cache');
    const events = sseEvents(Buffer.from(body, 'latin1').toString('utf8'));
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.ok(chunks.length >= 3);
    assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    assert.deepEqual(chunks.at(-1).choices, []);
    assert.ok(chunks.at(-1).usage.completion_tokens <= 8);
    const fin = chunks.at(-2).choices[0];
    assert.deepEqual(fin.delta, {});
    assert.ok(['stop', 'length'].includes(fin.finish_reason));

    const whole = await curl(['-sS', '-i', '-H', 'Content-Type: application/json', '--data-binary', chat({ max_tokens: 4 }),
      `${srv.base}/v1/chat/completions`]);
    const w = parseResponse(whole.stdout, false);
    assert.equal(w.status, 200);
    assert.equal(w.headers['content-type'], 'application/json');
    assert.equal(Number(w.headers['content-length']), Buffer.byteLength(w.body, 'latin1'));
  });

  it('malformed JSON and wrong types are 400 error objects', async () => {
    for (const body of ['{"messages": [', 'null', '[1,2]', '{"messages": "hello"}', '{"messages": [{"role": "user", "content": 5}]}',
      '{"messages": [{"role": "user", "content": "x"}], "max_tokens": {}}', '{"messages": [{"role": "user", "content": "x"}], "stop": 7}',
      '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}']) {
      const r = await curl(['-sS', '-w', '\n%{http_code}', '-H', 'Content-Type: application/json', '--data-binary', body, `${srv.base}/v1/chat/completions`]);
      const [json, code] = [r.stdout.slice(0, r.stdout.lastIndexOf('\n')), r.stdout.slice(r.stdout.lastIndexOf('\n') + 1)];
      assert.equal(code, '400', `${body} -> ${r.stdout}`);
      assert.equal(JSON.parse(json).error.type, 'invalid_request_error');
    }
    await assertAlive(assert, srv.base);
  });

  it('invalid UTF-8 in the body is a 400', async () => {
    const bad = Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "ab'), Buffer.from([0xff, 0xc3, 0x28]), Buffer.from('"}]}')]);
    const r = await curl(['-sS', '-w', '\n%{http_code}', '-H', 'Content-Type: application/json', '--data-binary', '@-', `${srv.base}/v1/chat/completions`], { input: bad });
    assert.ok(r.stdout.endsWith('\n400'), r.stdout);
    assert.match(r.stdout, /invalid_request_error/);
    await assertAlive(assert, srv.base);
  });

  it('a body over --max-body is a 413 (with Content-Length and chunked)', async () => {
    const big = Buffer.alloc((1 << 20) + 4096, 'a');
    const r = await curl(['-sS', '-w', '\n%{http_code}', '-H', 'Content-Type: application/json', '--data-binary', '@-', `${srv.base}/v1/chat/completions`], { input: big });
    assert.ok(r.stdout.endsWith('\n413'), `${r.stdout.slice(-200)} ${r.stderr}`);
    assert.match(r.stdout, /payload_too_large/);
    const c = await curl(['-sS', '-w', '\n%{http_code}', '-H', 'Transfer-Encoding: chunked', '-H', 'Content-Type: application/json', '--data-binary', '@-', `${srv.base}/v1/chat/completions`], { input: big });
    assert.ok(/\n4\d\d$/.test(c.stdout) || c.code !== 0, c.stdout.slice(-200));
    await assertAlive(assert, srv.base);
  });

  it('an oversized header line, or too many header bytes, is a 400 without harm', async () => {
    const r = await curl(['-sS', '-o', '/dev/null', '-w', '%{http_code}', '-H', `X-Big: ${'b'.repeat(20000)}`, `${srv.base}/health`]);
    assert.equal(r.stdout, '400');
    const lines = Array.from({ length: 1000 }, (_, i) => `X-H${i}: ${'c'.repeat(100)}`);
    const many = await curl(['-sS', '-o', '/dev/null', '-w', '%{http_code}', ...lines.flatMap((l) => ['-H', l]), `${srv.base}/health`]);
    assert.ok(many.stdout === '400' || many.code !== 0, `${many.stdout} ${many.stderr}`);
    await assertAlive(assert, srv.base);
  });

  it('a client that sends its request slowly does not hold up others', async () => {
    let slowDone = false;
    const slow = rawRequest(post(chat({ max_tokens: 3 })), { delayMs: 40, chunk: 4 }).then((r) => { slowDone = true; return r; });
    await sleep(100);
    await assertAlive(assert, srv.base);  // about 2 s before the slow request is even sent
    assert.equal(slowDone, false, 'the normal request waited for the slow one');
    const r = await slow;
    assert.equal(r.status, 200);
    assert.equal(JSON.parse(r.body).object, 'chat.completion');
  });

  it('a client that stops reading a stream neither blocks others nor loses its data', async () => {
    const s = await rawConnect(srv.port);
    const data = [];
    s.on('data', (d) => data.push(d));
    const closed = new Promise((resolve) => s.on('close', resolve));
    s.write(post(chat({ stream: true, max_tokens: 400, logit_bias: EOG_BAN })));
    await sleep(100);
    s.pause();
    await sleep(1500);
    await assertAlive(assert, srv.base);
    s.resume();
    await closed;
    const r = parseResponse(Buffer.concat(data).toString('latin1'));
    assert.equal(r.status, 200);
    const events = sseEvents(Buffer.from(r.body, 'latin1').toString('utf8'));
    assert.equal(events.at(-1), '[DONE]');
    assert.equal(JSON.parse(events.at(-2)).choices[0].finish_reason, 'length');
  });

  // The abandoned requests ask for 2000 tokens (EOG banned, so they would generate all of them); each must stop
  // within a few steps of the hang-up: the tokens it generated (counted when it ends) stay far below that, on
  // a fast machine too, where 2000 tokens may take less time than waitIdle() waits.
  const generated = () => metric(srv.base, 'qrig_generated_tokens_total');

  it('a client that disconnects mid-stream: its generation stops', async () => {
    const s = await rawConnect(srv.port);
    let got = '';
    const firstTokens = new Promise((resolve) => s.on('data', (d) => { got += d; if ((got.match(/data: /g) ?? []).length >= 4) resolve(); }));
    const before = await generated();
    s.write(post(chat({ stream: true, max_tokens: 2000, logit_bias: EOG_BAN })));
    await firstTokens;
    s.destroy();
    assert.ok(await waitIdle(), 'the engine still runs the abandoned request');
    const n = await generated();
    assert.ok(n - before >= 3 && n - before < 300, `the abandoned stream generated ${n - before} tokens`);
    await sleep(200);
    assert.equal(await generated(), n);
    // curl giving up (--max-time) is the same thing.
    const r = await curl(['-sS', '-N', '--max-time', '0.5', '-H', 'Content-Type: application/json', '--data-binary',
      chat({ stream: true, max_tokens: 2000, logit_bias: EOG_BAN }), `${srv.base}/v1/chat/completions`]);
    assert.equal(r.code, 28);
    assert.ok(await waitIdle());
    const m = await generated();
    assert.ok(m - n < 1000, `the stream curl gave up on generated ${m - n} tokens`);
    await assertAlive(assert, srv.base);
  });

  it('a client that disconnects while waiting for a whole response: its generation stops', async () => {
    const before = await generated();
    const s = await rawConnect(srv.port);
    s.write(post(chat({ max_tokens: 2000, logit_bias: EOG_BAN })));
    for (let i = 0; i < 100 && (await metric(srv.base, 'qrig_requests_running')) !== 1; ++i) await sleep(10);
    assert.equal(await metric(srv.base, 'qrig_requests_running'), 1);
    s.destroy();
    assert.ok(await waitIdle(), 'the engine still runs the abandoned request');
    const n = await generated();
    assert.ok(n - before < 300, `the abandoned request generated ${n - before} tokens`);
    await assertAlive(assert, srv.base);
  });

  it('CORS preflight and headers for browser clients', async () => {
    const r = await fetch(`${srv.base}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://x', 'Access-Control-Request-Method': 'POST' } });
    assert.equal(r.status, 204);
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.equal(r.headers.get('access-control-allow-origin'), '*');
    // What the openai and Anthropic SDKs send from a browser.
    const pre = await fetch(`${srv.base}/v1/messages`, { method: 'OPTIONS', headers: { Origin: 'http://x',
      'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'x-api-key,anthropic-version,anthropic-dangerous-direct-browser-access,x-stainless-os,x-stainless-lang,x-stainless-timeout' } });
    assert.equal(pre.status, 204);
    const allowed = pre.headers.get('access-control-allow-headers').toLowerCase().split(/\s*,\s*/);
    for (const h of ['authorization', 'content-type', 'x-api-key', 'anthropic-version', 'x-stainless-os', 'x-stainless-lang',
      'x-stainless-timeout', 'x-stainless-retry-count', 'anthropic-dangerous-direct-browser-access']) assert.ok(allowed.includes(h), h);
    const p = await postJSON(srv.base, '/v1/chat/completions', chat({ max_tokens: 1 }));
    assert.equal(p.headers.get('access-control-allow-origin'), '*');
  });
});
