// qrig serve driven by the openai SDK (current major): chat completions with n > 1 (n choices from one
// prefill, as /metrics shows: the prompt is computed once, the other samples start from its snapshot),
// streamed n > 1, the developer role (rendered as system), assistant prefill (a trailing assistant message
// is continued), and top-level enable_thinking.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, metric, EOG_BAN } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer();
  client = srv.client();
});
after(async () => { await srv?.stop(); });

describe('chat n > 1, developer role, assistant prefill (openai SDK)', () => {
  it('n = 3 gives 3 choices from one prefill', async () => {
    const messages = [{ role: 'user', content: `Tell me three stories ${Date.now()}` }];
    const computed0 = await metric(srv.base, 'qrig_prompt_tokens_total');
    const cached0 = await metric(srv.base, 'qrig_prompt_tokens_cached_total');
    const r = await client.chat.completions.create({
      model: 'tiny', messages, n: 3, max_tokens: 16, temperature: 1, seed: 7, logit_bias: EOG_BAN,
    });
    assert.equal(r.choices.length, 3);
    r.choices.forEach((c, i) => {
      assert.equal(c.index, i);
      assert.equal(c.message.role, 'assistant');
      assert.equal(c.finish_reason, 'length');
    });
    const t = await postJSON(srv.base, '/tokenize', { messages });
    assert.equal(r.usage.prompt_tokens, t.json.count);
    assert.equal(r.usage.completion_tokens, 3 * 16);
    // One prefill: the prompt was computed once; the two other samples reused all of it.
    assert.equal(await metric(srv.base, 'qrig_prompt_tokens_total') - computed0, t.json.count);
    assert.equal(await metric(srv.base, 'qrig_prompt_tokens_cached_total') - cached0, 2 * t.json.count);
    // Sampled with a seed: different samples, the same set again for the same seed.
    const texts = r.choices.map((c) => (c.message.reasoning_content ?? '') + c.message.content);
    assert.ok(new Set(texts).size > 1, JSON.stringify(texts));
    const again = await client.chat.completions.create({
      model: 'tiny', messages, n: 3, max_tokens: 16, temperature: 1, seed: 7, logit_bias: EOG_BAN,
    });
    assert.deepEqual(again.choices.map((c) => (c.message.reasoning_content ?? '') + c.message.content), texts);
  });

  it('n = 2 streamed: each choice has its role chunk, deltas and finish chunk, in index order', async () => {
    const stream = await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'Two answers' }], n: 2, max_tokens: 8, temperature: 0,
      logit_bias: EOG_BAN, stream: true, stream_options: { include_usage: true },
    });
    const roles = [0, 0], finishes = [], text = ['', ''];
    let last = 0, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        assert.ok(c.index >= last);
        last = c.index;
        if (c.delta.role) roles[c.index] += 1;
        text[c.index] += (c.delta.content ?? '') + (c.delta.reasoning_content ?? '');
        if (c.finish_reason) finishes.push([c.index, c.finish_reason]);
      }
    }
    assert.deepEqual(roles, [1, 1]);
    assert.deepEqual(finishes, [[0, 'length'], [1, 'length']]);
    assert.equal(text[0], text[1]);  // greedy: the same text twice
    assert.equal(usage.completion_tokens, 16);
  });

  it('the developer role is rendered as system', async () => {
    const dev = [{ role: 'developer', content: 'Answer in French.' }, { role: 'user', content: 'Hello' }];
    const sys = [{ role: 'system', content: 'Answer in French.' }, { role: 'user', content: 'Hello' }];
    const a = await postJSON(srv.base, '/tokenize', { messages: dev });
    const b = await postJSON(srv.base, '/tokenize', { messages: sys });
    assert.deepEqual(a.json.tokens, b.json.tokens);
    const ra = await client.chat.completions.create({ model: 'tiny', messages: dev, max_tokens: 10, temperature: 0 });
    const rb = await client.chat.completions.create({ model: 'tiny', messages: sys, max_tokens: 10, temperature: 0 });
    assert.equal(ra.choices[0].message.content, rb.choices[0].message.content);
    assert.equal(ra.choices[0].message.reasoning_content, rb.choices[0].message.reasoning_content);
  });

  it('a trailing assistant message is continued (assistant prefill)', async () => {
    const messages = [{ role: 'user', content: 'Count' }, { role: 'assistant', content: 'One, two,' }];
    const t = await postJSON(srv.base, '/tokenize', { messages, enable_thinking: false });
    assert.equal(t.status, 200, t.text);
    const detok = await postJSON(srv.base, '/detokenize', { tokens: t.json.tokens });
    assert.ok(detok.json.content.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\nOne, two,'), detok.json.content);
    const raw = await client.completions.create({
      model: 'tiny', prompt: t.json.tokens, max_tokens: 12, temperature: 0, presence_penalty: 0, logit_bias: EOG_BAN,
    });
    const r = await client.chat.completions.create({
      model: 'tiny', messages, max_tokens: 12, temperature: 0, presence_penalty: 0, logit_bias: EOG_BAN,
      enable_thinking: false,
    });
    assert.equal(r.choices[0].message.content, raw.choices[0].text);
    assert.equal(r.usage.prompt_tokens, t.json.count);
    // continue_final_message: false starts a new assistant turn instead.
    const fresh = await postJSON(srv.base, '/tokenize', { messages, enable_thinking: false, continue_final_message: false });
    assert.ok(fresh.json.count > t.json.count);
  });
});
