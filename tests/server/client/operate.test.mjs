// Operating `qrig serve` (issue 14), on a `qrig synth` model so that these tests need no fixtures: the load
// progress and the per-device memory summary in its output; /health and /metrics after requests (nothing
// processing, the latency histograms' _bucket/_sum/_count counting the requests, finish reasons, prefix-cache
// hits, the model label, llama-server's and vLLM's names when asked); /metrics without the key when asked;
// the request log (one line per request with its id, tokens, finish reason, errors, a client that left);
// llama-server's spellings of the flags.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, startServer, postJSON, rawConnect, sleep } from './helpers.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qrig-operate-'));
const MODEL = path.join(dir, 'synth-tiny.gguf');
const EOG_BAN = { 1000: -100, 1002: -100 };  // the synth vocabulary's <|endoftext|>, <|im_end|> (as tiny.gguf)

const chat = (content, extra = {}) => ({ messages: [{ role: 'user', content }], temperature: 0, ...extra });

// Every sample line of a metric family: name{labels} value.
function samples(text, name) {
  const out = [];
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (m && m[1] === name) out.push({ labels: m[2] ?? '', value: Number(m[3]) });
  }
  return out;
}
function one(text, name, labelPart = '') {
  const s = samples(text, name).filter((x) => x.labels.includes(labelPart));
  assert.equal(s.length, 1, `${name}${labelPart}: ${JSON.stringify(s)}\n${text.slice(0, 400)}`);
  return s[0].value;
}

async function metricsText(base, headers = {}) {
  const r = await fetch(`${base}/metrics`, { headers });
  assert.equal(r.status, 200);
  return r.text();
}

async function waitFor(pred, ms = 5000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return true;
    await sleep(20);
  }
  return false;
}

before(() => {
  execFileSync(BINARY, ['synth', '--preset', 'tiny', '--seed', '11', '-o', MODEL], { stdio: 'ignore' });
});
after(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('loading', () => {
  it('prints the load progress, the memory per device and "ready in N s" (synth model, CPU)', async () => {
    const srv = await startServer({ model: MODEL, parallel: 2, ctx: 1024 });
    try {
      const log = srv.log();
      assert.match(log, /qrig serve: compiled a plan for .*synth-tiny\.gguf: cpu backend, context 1024 tokens x 2 slots/);
      // Not a terminal: a line when the stage starts and one when it is done.
      assert.match(log, /qrig serve: reading weights: 0% \(0 B of [0-9.]+ MiB\)\n/);
      assert.match(log, /qrig serve: reading weights: done, [0-9.]+ MiB in [0-9.]+ s\n/);
      assert.match(log, /qrig serve: memory on cpu: weights [0-9.]+ MiB, KV cache [0-9.]+ [KMG]iB, GDN state [0-9.]+ [KMG]iB, activations [0-9.]+ [KMG]iB, snapshots [0-9.]+ [KMG]iB: [0-9.]+ [KMG]iB of the plan's [0-9.]+ [KMG]iB budget, [0-9.]+ [KMG]iB free\n/);
      assert.match(log, /qrig serve: ready in [0-9]+\.[0-9] s: model 'synth-tiny'/);
      // The order a user reads: progress, memory, ready.
      assert.ok(log.indexOf('reading weights: done') < log.indexOf('memory on cpu'));
      assert.ok(log.indexOf('memory on cpu') < log.indexOf('ready in'));
    } finally {
      await srv.stop();
    }
  });
});

describe('metrics and health after requests', () => {
  let srv;
  before(async () => { srv = await startServer({ model: MODEL, parallel: 2, ctx: 1024, args: ['--metrics-compat', 'llamacpp,vllm'] }); });
  after(async () => { await srv.stop(); });

  it('nothing is processing; the histograms count every request; compat names appear', async () => {
    const before = await metricsText(srv.base);
    const count0 = one(before, 'qrig_e2e_request_latency_seconds_count', 'model="synth-tiny"');
    // 2 whole + 1 streamed + 1 completion, 5 tokens each (end of generation banned: finish length).
    const reqs = [
      postJSON(srv.base, '/v1/chat/completions', chat('one', { max_tokens: 5, logit_bias: EOG_BAN })),
      postJSON(srv.base, '/v1/chat/completions', chat('two', { max_tokens: 5, logit_bias: EOG_BAN })),
      postJSON(srv.base, '/v1/completions', { prompt: 'three', max_tokens: 5, temperature: 0, logit_bias: EOG_BAN }),
    ];
    const streamed = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(chat('four', { max_tokens: 5, stream: true, logit_bias: EOG_BAN })),
    });
    assert.equal(streamed.status, 200);
    assert.match(await streamed.text(), /\[DONE\]/);
    for (const r of await Promise.all(reqs)) {
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].finish_reason, 'length');
      assert.equal(r.json.usage.completion_tokens, 5);
    }
    const n = 4;

    const h = await (await fetch(`${srv.base}/health`)).json();
    assert.equal(h.slots_processing, 0);
    assert.equal(h.slots_idle, 2);
    assert.equal(h.requests_queued, 0);

    const text = await metricsText(srv.base);
    const ml = 'model="synth-tiny"';
    assert.equal(one(text, 'qrig_requests_running'), 0);
    assert.equal(one(text, 'qrig_requests_queued'), 0);
    assert.equal(one(text, 'qrig_model_info', ml), 1);
    for (const h of ['qrig_time_to_first_token_seconds', 'qrig_time_per_output_token_seconds',
      'qrig_e2e_request_latency_seconds', 'qrig_request_queue_time_seconds']) {
      const count = one(text, `${h}_count`, ml);
      assert.equal(count - (h === 'qrig_e2e_request_latency_seconds' ? count0 : 0) >= n, true, `${h}_count ${count}`);
      const buckets = samples(text, `${h}_bucket`).filter((s) => s.labels.includes(ml));
      assert.ok(buckets.length > 10, h);
      assert.equal(buckets.at(-1).labels.includes('le="+Inf"'), true);
      assert.equal(buckets.at(-1).value, count, `${h}: +Inf bucket = count`);
      for (let k = 1; k < buckets.length; ++k) assert.ok(buckets[k].value >= buckets[k - 1].value, `${h} cumulative`);
      assert.ok(one(text, `${h}_sum`, ml) >= 0);
    }
    assert.equal(one(text, 'qrig_e2e_request_latency_seconds_count', ml) - count0, n);
    assert.ok(one(text, 'qrig_e2e_request_latency_seconds_sum', ml) > 0);
    assert.equal(one(text, 'qrig_finish_reason_total', 'reason="length"'), n);
    // llama-server's and vLLM's names for the same numbers.
    assert.equal(one(text, 'llamacpp:requests_processing'), 0);
    assert.equal(one(text, 'llamacpp:requests_deferred'), 0);
    assert.equal(one(text, 'llamacpp:tokens_predicted_total'), one(text, 'qrig_generated_tokens_total'));
    const vl = 'model_name="synth-tiny"';
    assert.equal(one(text, 'vllm:num_requests_running', vl), 0);
    assert.equal(one(text, 'vllm:e2e_request_latency_seconds_count', vl), one(text, 'qrig_e2e_request_latency_seconds_count', ml));
    assert.equal(one(text, 'vllm:request_success_total', 'finished_reason="length"'), n);
    assert.equal(one(text, 'vllm:generation_tokens_total', vl), one(text, 'qrig_generated_tokens_total'));
    assert.match(text, /^# TYPE vllm:time_to_first_token_seconds histogram$/m);
  });

  it('a repeated prompt is a prefix-cache hit', async () => {
    const before = await metricsText(srv.base);
    const hits0 = one(before, 'qrig_prefix_cache_hits_total');
    const queries0 = one(before, 'qrig_prefix_cache_queries_total');
    // The engine reuses a cached prompt that is a strict prefix of the new one (runtime/engine.cpp).
    const tokens = async (content) => (await postJSON(srv.base, '/tokenize', { content })).json.tokens;
    const prompt = await tokens('the same long prompt, word for word, twice in a row');
    const more = [...prompt, ...(await tokens(' and then some'))];
    const a = await postJSON(srv.base, '/v1/completions', { prompt, max_tokens: 2, temperature: 0 });
    const b = await postJSON(srv.base, '/v1/completions', { prompt: more, max_tokens: 2, temperature: 0 });
    assert.equal(a.status, 200, a.text);
    assert.equal(b.status, 200, b.text);
    assert.equal(b.json.usage.prompt_tokens_details.cached_tokens, prompt.length, JSON.stringify(b.json.usage));
    const text = await metricsText(srv.base);
    assert.equal(one(text, 'qrig_prefix_cache_queries_total') - queries0, 2);
    assert.equal(one(text, 'qrig_prefix_cache_hits_total') - hits0, 1);
  });
});

describe('metrics names and access', () => {
  it('no compat names unless asked; /metrics needs the key unless --metrics-public', async () => {
    const plain = await startServer({ model: MODEL, parallel: 1, ctx: 512, args: ['--api-key', 'k1'] });
    try {
      assert.equal((await fetch(`${plain.base}/metrics`)).status, 401);
      const text = await metricsText(plain.base, { Authorization: 'Bearer k1' });
      assert.doesNotMatch(text, /^llamacpp:/m);
      assert.doesNotMatch(text, /^vllm:/m);
      assert.match(text, /^qrig_model_info\{model="synth-tiny"\} 1$/m);
    } finally {
      await plain.stop();
    }
    const open = await startServer({ model: MODEL, parallel: 1, ctx: 512, args: ['--api-key', 'k1', '--metrics-public'] });
    try {
      assert.equal((await fetch(`${open.base}/metrics`)).status, 200);
      assert.equal((await fetch(`${open.base}/v1/models`)).status, 401);  // only /metrics (and /health) are public
    } finally {
      await open.stop();
    }
  });
});

describe('request log', () => {
  let srv;
  before(async () => { srv = await startServer({ model: MODEL, parallel: 1, ctx: 1024, requestLog: true }); });
  after(async () => { await srv.stop(); });
  // The log lines of requests (startServer's /health polls excluded: they may be logged late).
  const lines = () => srv.log().split('\n').filter((l) => /^qrig serve: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z /.test(l) &&
    !l.includes(' GET /health '));

  it('one line per request: id, route, status, tokens, speed, finish reason; errors say why', async () => {
    const n0 = lines().length;
    const ok = await postJSON(srv.base, '/v1/chat/completions', chat('hello', { max_tokens: 4, logit_bias: EOG_BAN }),
      { 'X-Request-Id': 'trace-42' });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get('x-request-id'), 'trace-42');
    const bad = await postJSON(srv.base, '/v1/chat/completions', '{"messages": [');
    assert.equal(bad.status, 400);
    const rid = bad.headers.get('x-request-id');
    assert.match(rid, /^req-[A-Za-z0-9]{16}$/);
    // A request id that is not a plain token is replaced (it cannot reach the log or the header as sent).
    const odd = await postJSON(srv.base, '/v1/chat/completions', chat('x', { max_tokens: 1 }), { 'X-Request-Id': 'a b"c' });
    assert.match(odd.headers.get('x-request-id'), /^req-/);
    const missing = await fetch(`${srv.base}/v1/nothing`);
    assert.equal(missing.status, 404);
    const missingId = missing.headers.get('x-request-id');
    assert.ok(await waitFor(() => lines().length >= n0 + 4));
    const mine = lines().slice(n0);
    assert.equal(mine.length, 4, mine.join('\n'));
    // Lines are written as responses end; find each by its id.
    const byId = (id) => {
      const l = mine.filter((x) => x.split(' ')[3] === id);
      assert.equal(l.length, 1, `${id}: ${mine.join('\n')}`);
      return l[0];
    };
    const u = ok.json.usage;
    assert.match(byId('trace-42'), new RegExp(`^qrig serve: \\S+ trace-42 127\\.0\\.0\\.1 POST /v1/chat/completions 200 [0-9.]+ ms ` +
      `prompt=${u.prompt_tokens} cached=${u.prompt_tokens_details.cached_tokens} generated=4 (prompt_tps=[0-9.]+ )?gen_tps=[0-9.]+ (queued=\\d+ms )?finish=length$`));
    assert.match(byId(rid), /^qrig serve: \S+ req-\S+ 127\.0\.0\.1 POST \/v1\/chat\/completions 400 [0-9.]+ ms error="the request body is not valid JSON: .*"$/);
    assert.match(byId(missingId), /^qrig serve: \S+ req-\S+ 127\.0\.0\.1 GET \/v1\/nothing 404 [0-9.]+ ms error="no route for GET \/v1\/nothing"$/);
    assert.ok(!mine.some((l) => l.includes('a b')), 'the odd request id is not logged');
  });

  it('a client that disconnects mid-stream is logged as such', async () => {
    const n0 = lines().length;
    const s = await rawConnect(srv.port);
    let got = '';
    const firstTokens = new Promise((resolve) => s.on('data', (d) => { got += d; if ((got.match(/data: /g) ?? []).length >= 3) resolve(); }));
    const body = JSON.stringify(chat('tell me everything', { stream: true, max_tokens: 2000, logit_bias: EOG_BAN }));
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: gone-1\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await firstTokens;
    s.destroy();
    assert.ok(await waitFor(() => lines().slice(n0).some((l) => l.includes(' gone-1 '))), srv.log().slice(-800));
    const line = lines().slice(n0).find((l) => l.includes(' gone-1 '));
    assert.match(line, / POST \/v1\/chat\/completions 200 [0-9.]+ ms prompt=\d+ cached=\d+ generated=\d+ .*finish=cancelled client disconnected$/);
  });
});

describe("llama-server's flags", () => {
  it('-m -c -np -a --host --port serve as qrig serve would', async () => {
    const srv = await startServer({ model: null, parallel: 1, ctx: 1024,
      args: ['-m', MODEL, '-c', '768', '-np', '2', '-a', 'my-model', '--host', '127.0.0.1'] });
    try {
      const m = await (await fetch(`${srv.base}/v1/models`)).json();
      assert.equal(m.data[0].id, 'my-model');
      assert.equal(m.data[0].meta.n_ctx, 768);
      assert.equal(m.data[0].meta.slots, 2);
    } finally {
      await srv.stop();
    }
  });
});
