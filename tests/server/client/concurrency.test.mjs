// Continuous batching seen from clients: 16 concurrent streaming clients against --parallel 4 all complete
// with a well-formed stream, and greedy outputs are the same alone and inside a batch of concurrent requests.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, chatRequest } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer({ parallel: 4 });
  client = srv.client();
});
after(async () => { await srv?.stop(); });

const prompts = Array.from({ length: 16 }, (_, i) => `Client number ${i} asks: what is ${i} plus ${i * 3}?`);
const request = (p) => chatRequest(p, { max_tokens: 24, temperature: 0, chat_template_kwargs: { enable_thinking: i(p) } });
// Half with thinking, half without, so both output paths run in one batch.
function i(p) { return Number(/number (\d+)/.exec(p)[1]) % 2 === 0; }

async function streamText(req) {
  const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const out = { content: '', reasoning: '', finish: null, usage: null, id: null, roles: 0, chunks: 0 };
  for await (const ch of s) {
    out.chunks += 1;
    out.id ??= ch.id;
    assert.equal(ch.id, out.id);
    if (ch.usage) out.usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.role) out.roles += 1;
    out.content += c.delta.content ?? '';
    out.reasoning += c.delta.reasoning_content ?? '';
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

describe('concurrency', () => {
  it('16 concurrent streaming clients on 4 slots all complete, each equal to its request run alone', async () => {
    // Alone, one after the other (also warms nothing up: every request has its own prompt).
    const alone = [];
    for (const p of prompts) alone.push(await client.chat.completions.create(request(p)));
    const t0 = Date.now();
    const together = await Promise.all(prompts.map((p) => streamText(request(p))));
    const seconds = (Date.now() - t0) / 1000;
    const ids = new Set();
    for (const [k, out] of together.entries()) {
      const ref = alone[k].choices[0];
      assert.equal(out.roles, 1);
      ids.add(out.id);
      assert.equal(out.finish, ref.finish_reason, `request ${k}`);
      assert.equal(out.content, ref.message.content ?? '', `request ${k} content`);
      assert.equal(out.reasoning, ref.message.reasoning_content ?? '', `request ${k} reasoning`);
      assert.equal(out.usage.completion_tokens, alone[k].usage.completion_tokens);
      assert.equal(out.usage.prompt_tokens, alone[k].usage.prompt_tokens);
    }
    assert.equal(ids.size, 16, 'every stream has its own id');
    assert.ok(seconds < 60, `16 streams took ${seconds} s`);
  });

  it('the same greedy request gives the same output alone and inside a batch of itself', async () => {
    const req = chatRequest('Determinism check', { max_tokens: 32, temperature: 0 });
    const alone = await client.chat.completions.create(req);
    const batch = await Promise.all(Array.from({ length: 6 }, () => client.chat.completions.create(req)));
    for (const r of batch) assert.deepEqual(r.choices[0].message, alone.choices[0].message);
  });
});
