// A mixed soak: 16 clients for QRIG_SOAK_SECONDS (60 in CI; scripts/soak.sh runs it longer for release
// checks) send streamed and whole chat completions, text completions, /tokenize and /health, some of them
// hanging up mid-stream, against one `qrig serve`. Every request must succeed (no error status, no broken
// stream) and the server's memory must stay bounded: RSS at the end at most 64 MiB above the highest value
// seen in the first quarter of the run (after warm-up), and never above 1 GiB.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, postJSON, sseEvents, sleep, chatRequest } from './helpers.mjs';

const SECONDS = Number(process.env.QRIG_SOAK_SECONDS ?? 60);
const CLIENTS = 16;

function rssMiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m[1]) / 1024;
}

async function streamed(base, body, { hangUpAfter = 0 } = {}) {
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }), signal: ac.signal,
  });
  if (r.status !== 200) return `stream status ${r.status}: ${await r.text()}`;
  if (hangUpAfter) {
    const reader = r.body.getReader();
    for (let i = 0; i < hangUpAfter; ++i) if ((await reader.read()).done) break;
    ac.abort();
    return null;
  }
  const events = sseEvents(await r.text());
  if (events.at(-1) !== '[DONE]') return `stream without [DONE]: ${events.slice(-2).join(' | ')}`;
  return null;
}

describe('soak', () => {
  it(`${CLIENTS} clients for ${SECONDS} s: no errors, bounded memory`, { timeout: (SECONDS + 120) * 1000 }, async () => {
    const srv = await startServer({ parallel: 4, args: ['--max-queue', '64'] });
    const errors = [];
    const counts = {};
    const t0 = Date.now();
    const deadline = t0 + SECONDS * 1000;
    let warm = 0;
    const sampler = setInterval(() => {
      const elapsed = Date.now() - t0;
      if (elapsed > SECONDS * 250 && elapsed < SECONDS * 500) warm = Math.max(warm, rssMiB(srv.proc.pid));
    }, 250);
    const kinds = [
      ['stream', (i) => streamed(srv.base, chatRequest(`soak ${i}`, { max_tokens: 24, temperature: 0.8 }))],
      ['hang-up', (i) => streamed(srv.base, chatRequest(`soak ${i}`, { max_tokens: 200 }), { hangUpAfter: 3 })],
      ['whole', async (i) => {
        const r = await postJSON(srv.base, '/v1/chat/completions', chatRequest(`soak ${i}`, { max_tokens: 16, seed: i }));
        return r.status === 200 && r.json.object === 'chat.completion' ? null : `whole ${r.status}: ${r.text.slice(0, 200)}`;
      }],
      ['completion', async (i) => {
        const r = await postJSON(srv.base, '/v1/completions', { prompt: `Once upon a time ${i}`, max_tokens: 12 });
        return r.status === 200 ? null : `completion ${r.status}: ${r.text.slice(0, 200)}`;
      }],
      ['tokenize', async (i) => {
        const r = await postJSON(srv.base, '/tokenize', { content: 'soak text '.repeat(200 + (i % 50)), with_pieces: i % 2 === 0 });
        return r.status === 200 && r.json.count > 0 ? null : `tokenize ${r.status}: ${r.text.slice(0, 200)}`;
      }],
      ['health', async () => ((await fetch(`${srv.base}/health`)).status === 200 ? null : 'health not 200')],
    ];
    const client = async (c) => {
      for (let j = 0, i = c; Date.now() < deadline; ++j, i += CLIENTS) {
        const [name, run] = kinds[(j + c) % kinds.length];
        counts[name] = (counts[name] ?? 0) + 1;
        try {
          const e = await run(i);
          if (e) errors.push(e);
        } catch (e) {
          if (!(name === 'hang-up' && e.name === 'AbortError')) errors.push(`${name}: ${e}`);
        }
      }
    };
    try {
      await Promise.all(Array.from({ length: CLIENTS }, (_, c) => client(c)));
      clearInterval(sampler);
      await sleep(500);
      const end = rssMiB(srv.proc.pid);
      const total = Object.values(counts).reduce((a, b) => a + b, 0);
      console.log(`soak: ${total} requests in ${SECONDS} s ${JSON.stringify(counts)}; RSS warm ${warm.toFixed(0)} MiB, end ${end.toFixed(0)} MiB`);
      assert.deepEqual(errors.slice(0, 5), []);
      assert.ok(total > SECONDS, `only ${total} requests`);
      assert.ok(warm > 0);
      assert.ok(end < warm + 64, `RSS grew from ${warm.toFixed(0)} to ${end.toFixed(0)} MiB`);
      assert.ok(end < 1024);
      const h = await fetch(`${srv.base}/health`);
      assert.equal((await h.json()).requests_queued, 0);
    } finally {
      clearInterval(sampler);
      await srv.stop();
    }
  });
});
