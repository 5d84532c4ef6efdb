// The shared prefix cache (issue 15, docs/prefix-cache.md) through the real server and the openai SDK: a chat
// replayed turn by turn with thinking on (the default template drops earlier answers' thinking, so a turn never
// extends the last prompt), an agent loop of tool calls and results, two questions after one long system prompt in
// different slots, an identical re-send, and a budget too small for all of it. Every output is compared with a
// server whose cache is off (--prefix-cache-mib 0): equal, token logprobs included (bit for bit on the CPU).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './helpers.mjs';

async function metricsText(base) {
  const r = await fetch(`${base}/metrics`);
  assert.equal(r.status, 200);
  return r.text();
}

const SYSTEM = 'You are a careful assistant for a small hardware shop. ' +
  'Answer in short sentences, name the part, its price and whether it is in stock. '.repeat(6) +
  'Never invent a part number; say when you do not know.';
const QUESTIONS = ['Do you have a 650 W power supply?', 'What about riser cables?', 'Is the CMP 100-210 in stock?',
  'How much is a x1 to x16 riser?', 'Any 8 GB cards left?', 'Do you ship to Lisbon?', 'Can I pay by card?',
  'What fans fit a 4U case?', 'Is there a bulk discount?', 'Thanks, what are your opening hours?'];

const one = (text, name) => {
  const m = new RegExp(`^${name.replace(/[:]/g, '\\$&')}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  assert.ok(m, `${name} in /metrics`);
  return Number(m[1]);
};
const gen = { model: 'tiny', max_tokens: 16, temperature: 0, logprobs: true };
const prefilled = (r) => r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens;
// Tool call ids are random: compared without them (the replays give them fixed ids).
const withoutIds = (m) => ({ ...m, tool_calls: m.tool_calls?.map(({ id, ...c }) => c) });
const sameOutput = (a, b, what) => {
  assert.deepEqual(withoutIds(a.choices[0].message), withoutIds(b.choices[0].message), what);
  assert.deepEqual(a.choices[0].logprobs, b.choices[0].logprobs, `${what}: logprobs`);
};

let on;
let off;
before(async () => {
  [on, off] = await Promise.all([startServer({ parallel: 2, ctx: 4096 }),
    startServer({ parallel: 2, ctx: 4096, args: ['--prefix-cache-mib', '0'] })]);
});
after(async () => { await Promise.all([on?.stop(), off?.stop()]); });

// Replays a conversation on both servers; returns the per-turn results of each.
async function replay(turns, first) {
  const msgs = { on: [...first], off: [...first] };
  const res = { on: [], off: [] };
  for (const t of turns) {
    for (const [k, srv] of [['on', on], ['off', off]]) {
      msgs[k].push(...t.append(res[k].at(-1)));
      const t0 = performance.now();
      const r = await srv.client().chat.completions.create({ ...gen, ...t.extra, messages: msgs[k] });
      r.ttft_ms = r.timings?.prompt_ms ?? performance.now() - t0;
      res[k].push(r);
    }
  }
  return res;
}

describe('prefix cache: chat and agent replays (openai SDK)', () => {
  it('a 10-turn chat with thinking on reuses every earlier turn and equals the cache-off run', async () => {
    const turns = QUESTIONS.map((q, i) => ({
      append: (prev) => [...(i > 0 ? [{ role: 'assistant', content: prev.choices[0].message.content ?? '' }] : []),
        { role: 'user', content: q }],
    }));
    const res = await replay(turns, [{ role: 'system', content: SYSTEM }]);
    for (let i = 0; i < turns.length; ++i) {
      const r = res.on[i];
      sameOutput(r, res.off[i], `turn ${i + 1}`);
      assert.equal(res.off[i].usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(r.timings.cache_n, r.usage.prompt_tokens_details.cached_tokens);
      // From turn 2 on: everything up to the previous turn's assistant header (its prompt less "<think>\n").
      if (i > 0) assert.ok(r.usage.prompt_tokens_details.cached_tokens >= res.on[i - 1].usage.prompt_tokens - 2,
        `turn ${i + 1}: cached ${r.usage.prompt_tokens_details.cached_tokens} of ${r.usage.prompt_tokens}, previous ` +
        `prompt ${res.on[i - 1].usage.prompt_tokens}`);
    }
    const last = res.on.at(-1), base = res.off.at(-1);
    const ratio = prefilled(last) / prefilled(base);
    console.log(`turn 10: prefilled ${prefilled(last)} of ${last.usage.prompt_tokens} tokens with the cache, ` +
      `${prefilled(base)} without (${(100 * ratio).toFixed(1)}%); time to first token ` +
      `${last.ttft_ms.toFixed(1)} ms vs ${base.ttft_ms.toFixed(1)} ms (${(last.ttft_ms / base.ttft_ms).toFixed(3)}x)`);
    assert.ok(ratio < 0.2, `turn 10 prefilled ${(100 * ratio).toFixed(1)}% of the cache-off run's tokens`);
  });

  it('an 8-round agent loop reuses all but the newly appended messages', async () => {
    const tools = [{ type: 'function', function: { name: 'lookup_part', description: 'Price and stock of a part',
      parameters: { type: 'object', properties: { part: { type: 'string', maxLength: 10 } }, required: ['part'] } } }];
    const rounds = Array.from({ length: 8 }, (_, i) => ({
      // Thinking off: the random model's thinking would use up max_tokens before the call.
      extra: { tools, tool_choice: 'required', max_tokens: 48, chat_template_kwargs: { enable_thinking: false } },
      append: (prev) => {
        if (i === 0) return [{ role: 'user', content: 'Price every part of a 6-card mining rig, one lookup at a time.' }];
        const m = prev.choices[0].message;
        const calls = m.tool_calls.map((c, k) => ({ ...c, id: `call_${i}_${k}` }));
        return [{ role: 'assistant', content: m.content ?? '', tool_calls: calls },
          ...calls.map((c, k) => ({ role: 'tool', tool_call_id: c.id,
            content: JSON.stringify({ part: `p${i}-${k}`, price: 10 * i + k, in_stock: (i + k) % 2 === 0 }) }))];
      },
    }));
    const res = await replay(rounds, [{ role: 'system', content: SYSTEM }]);
    for (let i = 0; i < rounds.length; ++i) {
      sameOutput(res.on[i], res.off[i], `round ${i + 1}`);
      assert.ok(res.on[i].choices[0].message.tool_calls?.length > 0);
      if (i > 0) {
        const r = res.on[i];
        // The previous prompt up to its assistant header: all but its generation prompt's "<think>\n\n</think>\n\n"
        // (6 tokens in the tiny vocabulary), where the new assistant message now stands.
        assert.ok(r.usage.prompt_tokens_details.cached_tokens >= res.on[i - 1].usage.prompt_tokens - 6,
          `round ${i + 1}: cached ${r.usage.prompt_tokens_details.cached_tokens}, previous prompt ` +
          `${res.on[i - 1].usage.prompt_tokens}`);
      }
    }
  });
});

describe('prefix cache: shared prompts across slots', () => {
  it('two questions after one long system prompt, at once in two slots, then one more: the system prompt is reused',
    async () => {
      const ask = (srv, q) => srv.client().chat.completions.create({ ...gen,
        messages: [{ role: 'system', content: SYSTEM + ' (slots)' }, { role: 'user', content: q }] });
      const first = await ask(on, 'Which riser is the cheapest?');
      // Two requests at once take both slots; both start from the first one's system prompt.
      const [a, b] = await Promise.all([ask(on, 'Do you sell PCIe splitters?'), ask(on, 'Where is the shop?')]);
      const [a0, b0] = await Promise.all([ask(off, 'Do you sell PCIe splitters?'), ask(off, 'Where is the shop?')]);
      sameOutput(a, a0, 'question a');
      sameOutput(b, b0, 'question b');
      const t = await fetch(`${on.base}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ content: SYSTEM + ' (slots)' }) });
      const sys = (await t.json()).tokens.length;  // the system message's text: all of it is reused
      assert.ok(first.usage.prompt_tokens > sys);
      for (const r of [a, b]) assert.ok(r.usage.prompt_tokens_details.cached_tokens >= sys,
        `cached ${r.usage.prompt_tokens_details.cached_tokens} of ${r.usage.prompt_tokens}`);
    });

  it('an identical re-send reuses all but the last token, in either slot', async () => {
    const req = { ...gen, messages: [{ role: 'user', content: 'Say something about GPUs, please.' }] };
    const first = await on.client().chat.completions.create(req);
    const again = await on.client().chat.completions.create(req);
    const base = await off.client().chat.completions.create(req);
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens - 1);
    sameOutput(again, base, 're-send');
    sameOutput(first, base, 'first');
    // The metrics say what happened.
    const text = await metricsText(on.base);
    assert.ok(one(text, 'qrig_prefix_cache_restores_total') >= 1);
    assert.ok(one(text, 'qrig_prefix_cache_bytes') > 0);
    assert.ok(one(text, 'qrig_prefix_cache_bytes') <= one(text, 'qrig_prefix_cache_budget_bytes'));
  });
});

describe('prefix cache: a budget too small for everything', () => {
  it('evicts, stays within its budget, and every answer still equals the cache-off run', async () => {
    // 6 MiB: a few snapshots of the tiny model's recurrent state (1.5 MiB each) with their KV spans (4 KiB a
    // token), while each request below takes four snapshots and a system prompt of its own.
    const small = await startServer({ parallel: 2, ctx: 4096, args: ['--prefix-cache-mib', '6'] });
    try {
      const text0 = await metricsText(small.base);
      const budget = one(text0, 'qrig_prefix_cache_budget_bytes');
      assert.equal(budget, 6 * 1024 * 1024);
      for (let i = 0; i < 6; ++i) {
        const req = { ...gen, messages: [{ role: 'system', content: `${SYSTEM} Shop ${i}.` },
          { role: 'user', content: QUESTIONS[i] }] };
        const [r, base] = await Promise.all([small.client().chat.completions.create(req),
          off.client().chat.completions.create(req)]);
        sameOutput(r, base, `request ${i}`);
        const again = await small.client().chat.completions.create(req);
        sameOutput(again, base, `request ${i} again`);
        const text = await metricsText(small.base);
        assert.ok(one(text, 'qrig_prefix_cache_bytes') <= budget);
      }
      const text = await metricsText(small.base);
      assert.ok(one(text, 'qrig_prefix_cache_evictions_total') > 0, 'evictions happened');
      const h = await fetch(`${small.base}/health`);
      assert.equal(h.status, 200);
    } finally {
      await small.stop();
    }
  });
});
