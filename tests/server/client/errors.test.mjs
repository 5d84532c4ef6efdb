// Errors as the openai SDK sees them: the status picks the SDK's error class, and the OpenAI error object
// carries type, param and code (400 with param, context overflow with n_prompt_tokens / n_ctx, 401 with an
// API key, 404, 429 when the queue is full).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, postJSON, assertAlive, chatRequest, EOG_BAN } from './helpers.mjs';

describe('request errors (openai SDK)', () => {
  let srv;
  let client;
  before(async () => {
    srv = await startServer({ ctx: 128 });
    client = srv.client();
  });
  after(async () => { await srv?.stop(); });

  async function rejects400(req, param) {
    await assert.rejects(client.chat.completions.create(req), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.param, param);
      assert.equal(typeof e.error.message, 'string');
      return true;
    });
  }

  it('invalid fields are 400 with the field in param', async () => {
    await rejects400({ model: 'tiny', messages: [] }, 'messages');
    await rejects400(chatRequest('x', { temperature: 'hot' }), 'temperature');
    await rejects400(chatRequest('x', { top_p: 7 }), 'top_p');
    await rejects400(chatRequest('x', { max_tokens: -3 }), 'max_tokens');
    await rejects400(chatRequest('x', { stop: ['', 'a'] }), 'stop[0]');
    await rejects400(chatRequest('x', { logit_bias: { foo: 1 } }), 'logit_bias');
    await rejects400(chatRequest('x', { top_logprobs: 3 }), 'top_logprobs');
    await rejects400(chatRequest('x', { tool_choice: 'required' }), 'tool_choice');
    await rejects400({ model: 'tiny', messages: [{ role: 'wizard', content: 'x' }] }, 'messages');
    await rejects400(chatRequest('x', { stream_options: { include_usage: true } }), 'stream_options');
    await assertAlive(assert, srv.base);
  });

  it('n > 16 and fields that would change the output unimplemented are 400s naming them', async () => {
    for (const [extra, param] of [[{ n: 17 }, 'n'], [{ mirostat: 2 }, 'mirostat'], [{ dry_multiplier: 0.8 }, 'dry_multiplier'],
      [{ use_beam_search: true }, 'use_beam_search']]) {
      await assert.rejects(client.chat.completions.create(chatRequest('x', extra)), (e) => {
        assert.equal(e.status, 400);
        assert.equal(e.param, param);
        assert.equal(e.type, 'invalid_request_error');
        assert.equal(e.code, 'unsupported_value');
        return true;
      });
    }
  });

  it('a prompt longer than the context is exceed_context_size_error with n_prompt_tokens and n_ctx', async () => {
    const long = 'lorem ipsum dolor sit amet '.repeat(40);
    for (const stream of [false, true]) {
      await assert.rejects(client.chat.completions.create(chatRequest(long, { stream })), (e) => {
        assert.equal(e.status, 400);
        assert.equal(e.type, 'exceed_context_size_error');
        assert.equal(e.error.n_ctx, 128);
        assert.ok(e.error.n_prompt_tokens > 128);
        assert.equal(e.param, 'messages');
        return true;
      });
    }
    const c = await postJSON(srv.base, '/v1/completions', { prompt: long });
    assert.equal(c.status, 400);
    assert.equal(c.json.error.type, 'exceed_context_size_error');
    assert.equal(c.json.error.param, 'prompt');
  });

  it('generation stops at the end of the context with finish_reason length', async () => {
    const r = await client.chat.completions.create(chatRequest('fill it', { max_tokens: 1000, logit_bias: EOG_BAN }));
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.total_tokens, 128);
  });

  it('unknown routes are 404 and wrong methods 405, as error objects', async () => {
    const r = await fetch(`${srv.base}/v1/no-such-thing`);
    assert.equal(r.status, 404);
    const j = await r.json();
    assert.equal(j.error.type, 'not_found_error');
    const p = await postJSON(srv.base, '/v2/chat', { a: 1 });
    assert.equal(p.status, 404);
    assert.equal(p.json.error.type, 'not_found_error');
    const m = await fetch(`${srv.base}/v1/chat/completions`);
    assert.equal(m.status, 405);
    assert.equal((await m.json()).error.code, 'method_not_allowed');
    await assertAlive(assert, srv.base);
  });
});

describe('API key', () => {
  let srv;
  before(async () => { srv = await startServer({ args: ['--api-key', 'k-123'], parallel: 1 }); });
  after(async () => { await srv?.stop(); });

  it('401 without or with a wrong key; the right key works; /health stays public', async () => {
    await assert.rejects(srv.client({ apiKey: 'wrong' }).chat.completions.create(chatRequest('x', { max_tokens: 2 })), (e) => {
      assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
      assert.equal(e.status, 401);
      assert.equal(e.type, 'authentication_error');
      return true;
    });
    // No key at all (the SDK refuses to send none, so plain fetch).
    const missing = await postJSON(srv.base, '/v1/chat/completions', chatRequest('x', { max_tokens: 2 }));
    assert.equal(missing.status, 401);
    assert.equal(missing.json.error.type, 'authentication_error');
    assert.equal(missing.headers.get('www-authenticate'), 'Bearer');
    const raw = await fetch(`${srv.base}/v1/models`);
    assert.equal(raw.status, 401);
    assert.equal((await fetch(`${srv.base}/health`)).status, 200);
    const ok = await srv.client({ apiKey: 'k-123' }).chat.completions.create(chatRequest('x', { max_tokens: 2 }));
    assert.equal(ok.object, 'chat.completion');
  });

  it('the key also comes from QRIG_API_KEY', async () => {
    const s2 = await startServer({ env: { QRIG_API_KEY: 'from-env' }, parallel: 1 });
    try {
      assert.equal((await fetch(`${s2.base}/v1/models`)).status, 401);
      const list = await s2.client({ apiKey: 'from-env' }).models.list();
      assert.equal(list.data[0].id, 'tiny');
    } finally {
      await s2.stop();
    }
  });
});

describe('queue full', () => {
  let srv;
  before(async () => { srv = await startServer({ parallel: 1, args: ['--max-queue', '1'] }); });
  after(async () => { await srv?.stop(); });

  it('is a 429 RateLimitError once the slot is busy and the queue holds one', async () => {
    const client = srv.client();
    const long = chatRequest('long', { max_tokens: 1800, logit_bias: EOG_BAN, stream: true });
    const first = await client.chat.completions.create(long);
    const it1 = first[Symbol.asyncIterator]();
    await it1.next();
    for (let i = 0; i < 200 && (await (await fetch(`${srv.base}/health`)).json()).slots_processing !== 1; ++i)
      await new Promise((r) => setTimeout(r, 10));
    const second = await client.chat.completions.create(long);  // queued behind the first
    const it2 = second[Symbol.asyncIterator]();
    await it2.next();
    await assert.rejects(client.chat.completions.create(chatRequest('x', { max_tokens: 2 })), (e) => {
      assert.ok(e instanceof OpenAI.RateLimitError, String(e));
      assert.equal(e.status, 429);
      assert.equal(e.headers.get('retry-after'), '1');
      return true;
    });
    first.controller.abort();
    second.controller.abort();
    // Both clients are gone: the server cancels their generations (within a poll interval and a step).
    let idle = false;
    for (let i = 0; i < 300 && !idle; ++i) {
      const h = await (await fetch(`${srv.base}/health`)).json();
      idle = h.slots_processing === 0 && h.requests_queued === 0;
      if (!idle) await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(idle, 'the abandoned requests were not cancelled');
    await assertAlive(assert, srv.base);
  });
});
